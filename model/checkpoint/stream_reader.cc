// StreamReader: reader threads pread planned byte ranges into a ring ahead of the consumer (stream_reader.h).
#include "model/checkpoint/stream_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dsv4::ckpt {

uint64_t StreamItem::bytes() const {
  uint64_t n = 0;
  for (const ByteRange& r : ranges) n += r.bytes;
  return n;
}

absl::StatusOr<std::unique_ptr<StreamReader>> StreamReader::Start(std::vector<StreamItem> items, uint8_t* arena,
                                                                  int64_t capacity, StreamOptions options) {
  if (capacity <= 0 || (arena == nullptr && !items.empty())) {
    return absl::InvalidArgumentError(absl::StrCat("stream reader: no staging arena (", capacity, " bytes)"));
  }
  options.threads = std::max(1, options.threads);
  options.chunk_bytes = std::max<int64_t>(4096, options.chunk_bytes);
  for (const StreamItem& it : items) {
    if (it.bytes() > static_cast<uint64_t>(capacity)) {
      return absl::InvalidArgumentError(absl::StrCat("stream reader: ", it.name, " (", it.bytes(),
                                                     " bytes) does not fit the staging arena of ", capacity, " bytes"));
    }
  }
  std::unique_ptr<StreamReader> r(new StreamReader(std::move(items), arena, capacity, options));
  // Files, places and chunks, all decided before any thread starts.
  std::map<std::string, int> fd_index;
  uint64_t at = 0;
  for (size_t i = 0; i < r->items_.size(); ++i) {
    const StreamItem& it = r->items_[i];
    auto [pos, inserted] = fd_index.try_emplace(it.path, static_cast<int>(r->fds_.size()));
    if (inserted) {
      const int fd = ::open(it.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        return absl::NotFoundError(absl::StrCat(it.name, ": cannot open ", it.path, ": ", std::strerror(errno)));
      }
      r->fds_.push_back(fd);
    }
    r->fd_of_item_.push_back(pos->second);
    const uint64_t b = it.bytes();
    if (at % capacity + b > static_cast<uint64_t>(capacity)) at += capacity - at % capacity;  // wrap to the start
    r->place_.push_back(at);
    uint64_t in_item = 0;
    for (const ByteRange& range : it.ranges) {
      for (uint64_t o = 0; o < range.bytes; o += options.chunk_bytes) {
        const uint64_t n = std::min<uint64_t>(options.chunk_bytes, range.bytes - o);
        r->chunks_.push_back({.item = i, .file_offset = range.offset + o, .bytes = n,
                              .arena_offset = at % capacity + in_item + o});
      }
      in_item += range.bytes;
    }
    r->left_.push_back(b);
    at += b;
  }
  for (int t = 0; t < options.threads; ++t) r->threads_.emplace_back([p = r.get()] { p->ReaderLoop(); });
  return r;
}

StreamReader::StreamReader(std::vector<StreamItem> items, uint8_t* arena, int64_t capacity, StreamOptions options)
    : items_(std::move(items)), arena_(arena), capacity_(capacity), options_(options) {}

StreamReader::~StreamReader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_) t.join();
  for (int fd : fds_) ::close(fd);
}

void StreamReader::Fail(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.ok()) error_ = std::move(status);
  }
  cv_.notify_all();
}

void StreamReader::ReaderLoop() {
  for (;;) {
    size_t c = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stop_ || !error_.ok() || next_chunk_ >= chunks_.size()) return;
      c = next_chunk_++;
      const Chunk& ch = chunks_[c];
      // The item's place is free once every earlier item overlapping it in the ring has been released.
      const uint64_t need = place_[ch.item] + items_[ch.item].bytes();
      cv_.wait(lock, [&] { return stop_ || !error_.ok() || need <= released_end_ + capacity_; });
      if (stop_ || !error_.ok()) return;
      if (in_flight_++ == 0) busy_since_ = std::chrono::steady_clock::now();
    }
    const bool ok = ReadChunk(c);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--in_flight_ == 0) {
        read_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - busy_since_).count();
      }
      if (ok) {
        left_[chunks_[c].item] -= chunks_[c].bytes;
        bytes_read_ += static_cast<int64_t>(chunks_[c].bytes);
      }
    }
    cv_.notify_all();
    if (!ok) return;
  }
}

bool StreamReader::ReadChunk(size_t c) {
  const Chunk& ch = chunks_[c];
  const StreamItem& it = items_[ch.item];
  const int fd = fds_[fd_of_item_[ch.item]];
  uint8_t* out = arena_ + ch.arena_offset;
  uint64_t done = 0;
  while (done < ch.bytes) {
    const ssize_t n = ::pread(fd, out + done, ch.bytes - done, static_cast<off_t>(ch.file_offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      Fail(absl::DataLossError(absl::StrCat(it.name, ": reading ", it.path, " at byte ", ch.file_offset + done, ": ",
                                            std::strerror(errno))));
      return false;
    }
    if (n == 0) {
      Fail(absl::DataLossError(absl::StrCat(it.name, ": ", it.path, " ends at byte ", ch.file_offset + done,
                                            ", before the tensor's bytes ", ch.file_offset, "..",
                                            ch.file_offset + ch.bytes, " (file truncated after its header was read?)")));
      return false;
    }
    done += static_cast<uint64_t>(n);
  }
  return true;
}

absl::StatusOr<const uint8_t*> StreamReader::Take(const std::string& expect) {
  std::unique_lock<std::mutex> lock(mu_);
  if (next_take_ >= items_.size()) {
    return absl::InternalError(absl::StrCat("weight stream: ", expect, " asked for after the planned items"));
  }
  const size_t i = next_take_;
  if (items_[i].name != expect) {
    return absl::InternalError(absl::StrCat("weight stream: the loader asked for ", expect, " but planned ",
                                            items_[i].name, " next"));
  }
  // What the readers need released before they may write item i. Every earlier item not yet released is held by
  // this (waiting) consumer, so if that is not enough the wait would never end: the arena is too small.
  const uint64_t need = place_[i] + items_[i].bytes();
  if (need > released_end_ + capacity_) {
    return absl::InternalError(absl::StrCat("weight stream: the staging arena (", capacity_, " bytes) cannot hold ",
                                            expect, " beside the tensors taken and not released"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  cv_.wait(lock, [&] { return !error_.ok() || left_[i] == 0; });
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (left_[i] != 0) return error_;
  ++next_take_;
  return arena_ + place_[i] % capacity_;
}

void StreamReader::ReleaseTaken() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (next_take_ == 0) return;
    released_end_ = place_[next_take_ - 1] + items_[next_take_ - 1].bytes();
  }
  cv_.notify_all();
}

StreamStats StreamReader::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  double read = read_seconds_;
  if (in_flight_ > 0) read += std::chrono::duration<double>(std::chrono::steady_clock::now() - busy_since_).count();
  return {.bytes = bytes_read_, .read_seconds = read, .consumer_wait_seconds = wait_seconds_,
          .threads = options_.threads};
}

}  // namespace dsv4::ckpt
