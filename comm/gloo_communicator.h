// GlooCommunicator: the CPU implementation of Communicator, over Gloo's TCP transport.
//
// Forming a group: every rank (leader included) dials the leader's TcpStoreServer (comm/tcp_store.h), announces
// itself under "arrive/<rank>", waits for all ranks (so a rank that never comes is named in the error), then
// gloo::rendezvous::Context::connectFullMesh exchanges transport addresses and opens one TCP connection per peer.
// Collectives are Gloo's: ring all-reduce (reduce-scatter + all-gather, so each element is summed once and every
// rank receives the same bits), ring all-gather, one-to-all broadcast, all-to-one barrier.
//
// Failure handling (see communicator.h): Gloo reports a closed peer socket or a passed deadline as an exception;
// this class converts it into UNAVAILABLE, drops the Gloo context (closing every socket, so the other ranks fail
// within milliseconds instead of waiting for their deadline) and stays broken. Writing to a socket whose peer
// died raises SIGPIPE, which would kill the process; Create() therefore sets SIGPIPE to SIG_IGN process-wide
// (gRPC servers already expect that).
//
// Threading: one thread at a time calls the collectives; Gloo runs its own I/O thread inside the TCP device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace dsv4::comm {

struct GlooOptions {
  CommOptions comm;
  std::string store_addr;        // "host:port" of the leader's TcpStoreServer
  std::string bind_host = "127.0.0.1";  // this rank's reachable address; Gloo listens here for its peers
};

class GlooCommunicator final : public Communicator {
 public:
  // Joins the group; DEADLINE_EXCEEDED naming the missing ranks when not all `world` ranks arrive within
  // options.comm.startup_timeout, InvalidArgument for a bad rank/world/address.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(int rank, int world, const GlooOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string_view backend() const override { return "gloo"; }

  absl::Status AllReduceSum(float* data, size_t n) override;
  absl::Status AllReduceSumBf16(uint16_t* data, size_t n) override;
  absl::Status AllGather(const void* send, void* recv, size_t bytes_per_rank) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Barrier() override;

 private:
  GlooCommunicator(int rank, int world, CommOptions options, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context);
  // Records the first failure, closes every connection and returns the UNAVAILABLE status.
  absl::Status Fail(const std::string& op, const std::string& what);
  absl::Status AllReduceF32(float* data, size_t n, const std::string& op);

  const int rank_;
  const int world_;
  const CommOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;  // null once broken
  absl::Status broken_;                     // OK until the first failure
  std::vector<float> scratch_;              // bf16 all-reduce widens into this
};

}  // namespace dsv4::comm
