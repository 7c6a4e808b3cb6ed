// TcpStoreServer / TcpStoreClient: see tcp_store.h for the protocol.
#include "comm/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "gloo/common/error.h"

namespace dsv4::comm {
namespace {

constexpr uint32_t kMaxKeyBytes = 4096;
constexpr uint32_t kMaxValueBytes = 16u << 20;
// Server threads wake this often to notice shutdown.
constexpr int kServerPollMs = 100;

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// Moves exactly n bytes in `dir` (POLLIN: recv, POLLOUT: send) before the deadline, or while *stop stays false
// (server side, where the deadline is "forever"). False on EOF, error, deadline or stop.
bool TransferAll(int fd, char* buf, size_t n, short dir, Clock::time_point deadline,
                 const std::atomic<bool>* stop = nullptr) {
  size_t done = 0;
  while (done < n) {
    pollfd p{fd, dir, 0};
    const int wait_ms = stop != nullptr ? kServerPollMs : RemainingMs(deadline);
    const int r = poll(&p, 1, wait_ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) {
      if (stop != nullptr ? stop->load() : Clock::now() >= deadline) return false;
      continue;
    }
    const ssize_t k = dir == POLLIN ? recv(fd, buf + done, n - done, 0)
                                    : send(fd, buf + done, n - done, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    done += static_cast<size_t>(k);
  }
  return true;
}

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Resolves host:port to a socket address (first IPv4/IPv6 result).
absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  return res;
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& addr) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
    return absl::InvalidArgumentError(absl::StrCat("address '", addr, "' is not host:port"));
  }
  std::string host = addr.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = 0;
  if (!absl::SimpleAtoi(addr.substr(colon + 1), &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("address '", addr, "' has no valid port (1..65535)"));
  }
  return std::make_pair(host, port);
}

// ---------------------------------------------------------------- server

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host, int port) {
  if (port < 0 || port > 65535) return absl::InvalidArgumentError(absl::StrCat("store port ", port, " out of range"));
  auto res_or = Resolve(host, port, /*passive=*/true);
  if (!res_or.ok()) return res_or.status();
  addrinfo* res = *res_or;
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(res);
    return absl::InternalError(absl::StrCat("store socket(): ", std::strerror(errno)));
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    const int err = errno;
    freeaddrinfo(res);
    close(fd);
    return absl::UnavailableError(absl::StrCat("store cannot listen on ", host, ":", port, ": ", std::strerror(err)));
  }
  freeaddrinfo(res);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int bound_port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                                     : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  auto server = std::unique_ptr<TcpStoreServer>(new TcpStoreServer(host, fd, bound_port));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::TcpStoreServer(std::string host, int listen_fd, int port)
    : host_(std::move(host)), listen_fd_(listen_fd), port_(port) {}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : conn_fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(conn_threads_);
  }
  for (auto& t : threads) t.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : conn_fds_) close(fd);
  close(listen_fd_);
}

std::string TcpStoreServer::Address(const std::string& advertise_host) const {
  const std::string& h = advertise_host.empty() ? host_ : advertise_host;
  return h.find(':') != std::string::npos ? absl::StrCat("[", h, "]:", port_) : absl::StrCat(h, ":", port_);
}

void TcpStoreServer::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, kServerPollMs) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    conn_fds_.push_back(fd);
    conn_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

// Serves one connection until the peer closes it, sends something malformed, or the server stops.
void TcpStoreServer::Serve(int fd) {
  const auto forever = Clock::time_point::max();
  while (!stop_) {
    char head[5];
    if (!TransferAll(fd, head, 5, POLLIN, forever, &stop_)) break;
    const char op = head[0];
    const uint32_t key_len = GetU32(head + 1);
    if ((op != 'S' && op != 'G') || key_len > kMaxKeyBytes) break;
    std::string key(key_len, '\0');
    if (!TransferAll(fd, key.data(), key_len, POLLIN, forever, &stop_)) break;
    std::string reply;
    if (op == 'S') {
      char len_buf[4];
      if (!TransferAll(fd, len_buf, 4, POLLIN, forever, &stop_)) break;
      const uint32_t value_len = GetU32(len_buf);
      if (value_len > kMaxValueBytes) break;
      std::vector<char> value(value_len);
      if (!TransferAll(fd, value.data(), value_len, POLLIN, forever, &stop_)) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::move(value);
      }
      reply.push_back(1);
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      reply.push_back(it != data_.end() ? 1 : 0);
      if (it != data_.end()) {
        PutU32(&reply, static_cast<uint32_t>(it->second.size()));
        reply.append(it->second.data(), it->second.size());
      }
    }
    if (!TransferAll(fd, reply.data(), reply.size(), POLLOUT, forever, &stop_)) break;
  }
  // The fd stays in conn_fds_ until the destructor; closing here could let the number be reused and then
  // shut down by the destructor, so only shut it down.
  shutdown(fd, SHUT_RDWR);
}

// ---------------------------------------------------------------- client

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& addr,
                                                                        std::chrono::milliseconds timeout) {
  auto hp = ParseHostPort(addr);
  if (!hp.ok()) return hp.status();
  const auto deadline = Clock::now() + timeout;
  std::string last_error;
  while (true) {
    auto res_or = Resolve(hp->first, hp->second, /*passive=*/false);
    if (res_or.ok()) {
      addrinfo* res = *res_or;
      const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const bool ok = fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0;
      last_error = std::strerror(errno);
      freeaddrinfo(res);
      if (ok) {
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(fd, addr, timeout));
      }
      if (fd >= 0) close(fd);
    } else {
      last_error = std::string(res_or.status().message());
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("cannot reach the rendezvous store at ", addr, " within ",
                                                  timeout.count(), " ms: ", last_error));
}

TcpStoreClient::~TcpStoreClient() { close(fd_); }

void TcpStoreClient::set(const std::string& key, const std::vector<char>& data) {
  if (key.size() > kMaxKeyBytes || data.size() > kMaxValueBytes) {
    throw gloo::IoException(absl::StrCat("store key/value too large for key '", key, "'"));
  }
  std::string req;
  req.push_back('S');
  PutU32(&req, static_cast<uint32_t>(key.size()));
  req += key;
  PutU32(&req, static_cast<uint32_t>(data.size()));
  req.append(data.data(), data.size());
  const auto deadline = Clock::now() + timeout_;
  char ack = 0;
  if (!TransferAll(fd_, req.data(), req.size(), POLLOUT, deadline) ||
      !TransferAll(fd_, &ack, 1, POLLIN, deadline) || ack != 1) {
    throw gloo::IoException(absl::StrCat("rendezvous store ", addr_, " lost while setting '", key, "'"));
  }
}

bool TcpStoreClient::TryGet(const std::string& key, std::vector<char>* value) {
  std::string req;
  req.push_back('G');
  PutU32(&req, static_cast<uint32_t>(key.size()));
  req += key;
  const auto deadline = Clock::now() + timeout_;
  char found = 0;
  if (!TransferAll(fd_, req.data(), req.size(), POLLOUT, deadline) ||
      !TransferAll(fd_, &found, 1, POLLIN, deadline)) {
    throw gloo::IoException(absl::StrCat("rendezvous store ", addr_, " lost while reading '", key, "'"));
  }
  if (found == 0) return false;
  char len_buf[4];
  if (!TransferAll(fd_, len_buf, 4, POLLIN, deadline)) {
    throw gloo::IoException(absl::StrCat("rendezvous store ", addr_, " lost while reading '", key, "'"));
  }
  value->resize(GetU32(len_buf));
  if (!TransferAll(fd_, value->data(), value->size(), POLLIN, deadline)) {
    throw gloo::IoException(absl::StrCat("rendezvous store ", addr_, " lost while reading '", key, "'"));
  }
  return true;
}

std::vector<char> TcpStoreClient::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<char> value;
  if (!TryGet(key, &value)) throw gloo::IoException(absl::StrCat("store key '", key, "' vanished"));
  return value;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<std::string> missing = keys;
  std::vector<char> scratch;
  while (true) {
    std::vector<std::string> still;
    for (const auto& k : missing) {
      if (!TryGet(k, &scratch)) still.push_back(k);
    }
    missing.swap(still);
    if (missing.empty()) return;
    if (Clock::now() >= deadline) {
      throw gloo::IoException(absl::StrCat("timed out after ", timeout.count(),
                                           " ms waiting for rendezvous key(s) ", absl::StrJoin(missing, ", ")));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace dsv4::comm
