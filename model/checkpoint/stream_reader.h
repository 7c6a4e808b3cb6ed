// Streams a planned list of checkpoint byte ranges into a caller-owned staging arena (pinned host memory on a
// GPU: Backend::Allocate(kHostStaging)) with reader threads, ahead of a consumer that takes them in plan order.
// Used by the weight loader on device backends (model/dsv4/weights.cc, docs/worker.md "Weight loading"): while
// the backend copies and prepares one group of tensors, the readers pread the next ones, so disk / page-cache
// reads overlap the host-to-device copies, and nothing but the planned ranges (this rank's shard) is read.
//
// The arena is a ring. Item i gets a fixed place in it, decided from the plan alone: items follow each other,
// and one that would run past the end starts again at the beginning. A reader may write item i only once the
// consumer has released every earlier item whose place overlaps it, so the consumer may hold any run of items
// whose places span at most `capacity` bytes at once (ReleaseTaken frees everything taken so far). The caller
// sizes the arena from its plan (the largest run it holds between releases, twice over, lets reads run one run
// ahead). Items are read in chunks (chunk_bytes) so several threads share one large tensor.
//
// Errors: a failed or short read (a file truncated after its header was read) ends the stream; Take returns it,
// naming the tensor and the file. Every item is checked against the name the consumer expects.
//
// Threading: one consumer thread calls Take / ReleaseTaken / stats; the reader threads are internal and are
// stopped and joined by the destructor (also mid-stream, after an error).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dsv4::ckpt {

// `bytes` bytes of `path` from `offset`.
struct ByteRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// One thing the consumer takes: the ranges of one file, packed one after another in the arena.
struct StreamItem {
  std::string name;  // the tensor (or "tensor rows a..b"), checked at Take and named in errors
  std::string path;  // the file
  std::vector<ByteRange> ranges;
  uint64_t bytes() const;
};

struct StreamOptions {
  int threads = 4;                   // reader threads
  int64_t chunk_bytes = 16 << 20;    // largest single pread
};

struct StreamStats {
  int64_t bytes = 0;               // read so far
  double read_seconds = 0;         // wall time with at least one read in flight
  double consumer_wait_seconds = 0;  // time Take spent waiting for reads
  int threads = 0;
};

class StreamReader {
 public:
  // Starts reading `items` into arena[0, capacity). Refuses an item larger than the arena.
  static absl::StatusOr<std::unique_ptr<StreamReader>> Start(std::vector<StreamItem> items, uint8_t* arena,
                                                             int64_t capacity, StreamOptions options = {});
  ~StreamReader();
  StreamReader(const StreamReader&) = delete;
  StreamReader& operator=(const StreamReader&) = delete;

  // The next item's bytes (valid until ReleaseTaken), after waiting for its reads. `expect` must be the item's
  // name (a loader that asks for something else than it planned is a bug: Internal naming both).
  absl::StatusOr<const uint8_t*> Take(const std::string& expect);
  // Lets the readers reuse every item taken so far.
  void ReleaseTaken();
  // Items not yet taken.
  size_t remaining() const { return items_.size() - next_take_; }
  StreamStats stats() const;

 private:
  StreamReader(std::vector<StreamItem> items, uint8_t* arena, int64_t capacity, StreamOptions options);
  void ReaderLoop();
  // Reads one chunk; returns false after an error was recorded.
  bool ReadChunk(size_t chunk);
  void Fail(absl::Status status);

  struct Chunk {
    size_t item;
    uint64_t file_offset, bytes, arena_offset;
  };
  const std::vector<StreamItem> items_;
  uint8_t* const arena_;
  const int64_t capacity_;
  const StreamOptions options_;
  std::vector<uint64_t> place_;     // item -> virtual start in the ring (arena offset = place % capacity)
  std::vector<int> fd_of_item_;     // item -> index into fds_
  std::vector<int> fds_;
  std::vector<Chunk> chunks_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> left_;      // item -> bytes still to read
  uint64_t released_end_ = 0;       // virtual end of the last released item (0: none)
  size_t next_take_ = 0;            // consumer: next item to take
  size_t next_chunk_ = 0;           // readers: next chunk to claim
  absl::Status error_;
  bool stop_ = false;
  int in_flight_ = 0;
  std::chrono::steady_clock::time_point busy_since_;
  double read_seconds_ = 0, wait_seconds_ = 0;
  int64_t bytes_read_ = 0;
  std::vector<std::thread> threads_;
};

}  // namespace dsv4::ckpt
