// A small TCP key-value store for Gloo's rendezvous.
//
// Why our own: Debian's libgloo-dev (0.0~git20220518) ships only file, hash (in-process), prefix and Redis
// stores; the TCPStore lives in PyTorch, not Gloo. The leader (rank 0) runs a TcpStoreServer and hands its
// "host:port" to followers in RendezvousResponse.gloo_store_addr; every rank (the leader included) talks to it
// through a TcpStoreClient, which is a gloo::rendezvous::Store. Ranks publish their transport addresses under
// keys and wait for the others' (gloo::rendezvous::Context::connectFullMesh does that).
//
// Wire format, one request per round trip on a kept-open connection:
//   request  = op:u8 ('S' set | 'G' get) , key_len:u32 , key , [value_len:u32 , value]   (value only for 'S')
//   response = 'S': ok:u8 = 1 ;  'G': found:u8 , [value_len:u32 , value]                  (value only if found)
// Integers are little-endian. Keys up to 4 KiB, values up to 16 MiB; anything else closes the connection.
//
// Threading: the server runs one accept thread and one thread per connection (a group has a handful of ranks);
// its destructor stops and joins them. A client is used by one thread at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "gloo/rendezvous/store.h"

namespace dsv4::comm {

// "host:port" or "[v6addr]:port" -> (host, port). InvalidArgument naming the text otherwise.
absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& addr);

class TcpStoreServer {
 public:
  // Listens on host:port (port 0 picks a free port; host "0.0.0.0" listens on every interface).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, int port);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // The address clients should dial: `advertise_host`:port (the listen host when empty).
  std::string Address(const std::string& advertise_host = "") const;

 private:
  TcpStoreServer(std::string host, int listen_fd, int port);
  void AcceptLoop();
  void Serve(int fd);

  const std::string host_;
  const int listen_fd_;
  const int port_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<std::string, std::vector<char>> data_ ABSL_GUARDED_BY(mu_);
  std::vector<int> conn_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> conn_threads_ ABSL_GUARDED_BY(mu_);
  std::thread accept_thread_;
};

// gloo's Store interface throws on failure (gloo::IoException), so this class does too; the Status-returning
// Connect is the only entry point that does not.
class TcpStoreClient final : public gloo::rendezvous::Store {
 public:
  // Dials addr, retrying until `timeout` (the server may not be up yet). `timeout` is also the default wait.
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const std::string& addr,
                                                                 std::chrono::milliseconds timeout);
  ~TcpStoreClient() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits (up to the default timeout) for the key, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  // Throws gloo::IoException naming the missing keys when the deadline passes.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  TcpStoreClient(int fd, std::string addr, std::chrono::milliseconds timeout)
      : fd_(fd), addr_(std::move(addr)), timeout_(timeout) {}
  // One 'G' round trip: true and *value when present.
  bool TryGet(const std::string& key, std::vector<char>* value);

  const int fd_;
  const std::string addr_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace dsv4::comm
