// Forming a worker group: the leader/follower rendezvous over the Worker gRPC service (ARCHITECTURE.md §1).
//
// Only the leader's address is configured anywhere. Sequence (T = world):
//   leader (rank 0)                                   follower (rank r = 1..T-1)
//   RendezvousLeader::Create: starts the Gloo TCP     JoinGroup: calls Worker.Rendezvous(rank, world,
//     store (and makes the NCCL unique id on GPU)       fingerprint, host) on the leader, retrying while the
//   serves Worker.Rendezvous -> Handle():               leader is not up yet, until the start-up deadline;
//     refuses a wrong world, a rank out of range,       a refusal (FAILED_PRECONDITION) ends it at once
//     a different checkpoint fingerprint or a rank   -> gets gloo_store_addr (+ nccl_unique_id)
//     taken by another host (FAILED_PRECONDITION)    -> GlooCommunicator (+ NcclCommunicator) joins the group
//   FormGroup(): waits until every follower was
//     accepted (DEADLINE_EXCEEDED naming the missing
//     ranks and why they were refused), then joins the
//     same communicators
// Both sides end with a Group: `control` (Gloo, or Local for world 1) carries step plans and heartbeats, `data`
// (NCCL on GPU groups, otherwise the same object as control) carries the forward's activation collectives.
//
// Wiring in the worker (worker/service.cc): the Rendezvous reactor calls
//   reactor->Finish(ToGrpcStatus(leader->Handle(*request, response)));
// Handle() never blocks, so it is safe inside a callback reaction. Followers serve only Rendezvous (refusing:
// they are not leaders) and health.
//
// Threading: Handle() may be called from any number of gRPC threads while one thread runs FormGroup().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "common/tls_options.h"
#include "dsv4/v1/worker.pb.h"

namespace dsv4::comm {

struct GroupOptions {
  int rank = 0;
  int world = 1;
  std::string checkpoint_fingerprint;  // CheckpointFingerprint(dir): every rank must load the same checkpoint
  std::string host = "127.0.0.1";     // this rank's reachable address (Gloo listens here; the leader's store too)
  std::string leader_addr;             // followers: the leader's Worker gRPC address, host:port
  ChannelSecurity leader_security{};   // followers: how to dial the leader (plaintext by default; docs/security.md)
  int store_port = 0;                  // leader: port of the Gloo rendezvous store (0 = any free port)
  bool use_nccl = false;               // GPU group: also form an NCCL communicator for the data plane
  int cuda_device = 0;                 // with use_nccl
  CommOptions comm;                    // collective and start-up deadlines
  std::chrono::milliseconds retry_interval{200};  // followers: pause between Rendezvous attempts
};

struct Group {
  std::unique_ptr<Communicator> control;  // host communicator: step plans, heartbeats, BroadcastBytes
  std::unique_ptr<Communicator> nccl;     // GPU groups only; null otherwise
  // The communicator the forward's collectives use.
  Communicator& data() { return nccl != nullptr ? *nccl : *control; }
};

class RendezvousLeader {
 public:
  // Validates the options and, for world > 1, starts the store (and makes the NCCL id) so Handle can answer.
  static absl::StatusOr<std::unique_ptr<RendezvousLeader>> Create(const GroupOptions& options);

  // The Worker.Rendezvous handler body: FAILED_PRECONDITION naming the mismatch, or OK with *response filled.
  // Idempotent for a retried request from the same host.
  absl::Status Handle(const dsv4::v1::RendezvousRequest& request, dsv4::v1::RendezvousResponse* response);

  // Waits for every follower to be accepted, then joins the communicators. Call once.
  absl::StatusOr<Group> FormGroup();

  // "host:port" the followers dial for the Gloo store (empty for world 1).
  std::string store_address() const;

 private:
  explicit RendezvousLeader(GroupOptions options) : options_(std::move(options)) {}
  absl::Status Refuse(int rank, const std::string& why);

  const GroupOptions options_;
  std::unique_ptr<TcpStoreServer> store_;
  std::string nccl_id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::string> joined_;   // rank -> host, guarded by mu_
  std::vector<std::string> refusals_;   // recent refusal messages (for FormGroup's error), guarded by mu_
  std::atomic<bool> formed_{false};     // set once every follower was accepted; later requests are refused
};

// Follower side: rendezvous with the leader at options.leader_addr, then join the communicators.
absl::StatusOr<Group> JoinGroup(const GroupOptions& options);

// Only the RPC part of JoinGroup: the leader's answer, after retries. Exposed for tests and for the worker if
// it wants to log the answer before joining.
absl::StatusOr<dsv4::v1::RendezvousResponse> CallRendezvous(const GroupOptions& options);

// A stable fingerprint of a checkpoint folder: FNV-1a 64 over config.json, hf_quant_config.json (if present),
// model.safetensors.index.json (if present), and the JSON header plus the first 4 KiB of tensor data of every
// .safetensors file, in name order (the data sample tells apart checkpoints of one shape, e.g. another seed).
// Reads a few KiB per file (milliseconds for a 160 GB checkpoint). "fnv1a64:<16 hex digits>".
absl::StatusOr<std::string> CheckpointFingerprint(const std::string& dir);

}  // namespace dsv4::comm
