// Tensor-parallel start-up of one dsv4-worker process (docs/tensor-parallel.md "Wiring in the worker").
//
//   rank 0 (leader): MakeRendezvousLeader before the gRPC server starts (its Worker.Rendezvous handler delegates
//     to it), FormGroup once the server is up, then the rank's sharded executor wrapped by WrapLeader in a
//     comm::LockstepLeader: the engine drives the whole group through the ModelExecutor interface.
//   ranks >= 1 (followers): RunFollowerRank is the whole process after flag checks: a gRPC server with health
//     and a refusing Rendezvous only, JoinGroup at --leader, load the shard, then apply the leader's step plans
//     until its shutdown plan (OK) or a failure (the caller exits non-zero; the group restarts as a whole).
//   Both serve gRPC with --tls-* (docs/security.md); followers dial the leader's Rendezvous with --leader-tls-ca,
//   presenting --tls-cert, and may serve a plaintext probe port (--health-listen).
#pragma once

#include <csignal>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "comm/rendezvous.h"
#include "worker/dsv4_executor.h"
#include "worker/model_executor.h"
#include "worker/options.h"

namespace dsv4::worker {

// The group options of this rank (fingerprint of --checkpoint, --host, --leader, the two timeouts).
absl::StatusOr<comm::GroupOptions> MakeGroupOptions(const WorkerOptions& o);

// Rank 0 of a group of world > 1: starts the rendezvous store; null for world 1.
absl::StatusOr<std::unique_ptr<comm::RendezvousLeader>> MakeRendezvousLeader(const WorkerOptions& o);

// Logs "tensor parallel rank r of T loaded: resident N MiB" (the shard layer's ResidentBytes).
void LogResident(const WorkerOptions& o);

// The leader's executor for the engine: `local` (already sharded) behind a LockstepLeader on group.control.
// on_failure runs once when the group breaks (the process reports NOT_SERVING there). `group` must outlive it.
std::unique_ptr<ModelExecutor> WrapLeader(std::unique_ptr<ModelExecutor> local, comm::Group& group,
                                          const WorkerOptions& o, std::function<void(const absl::Status&)> on_failure);

// A follower rank's whole life after flag checks. on_ready(grpc_port) is called once the shard is loaded (the
// process writes its ready file there). SIGTERM/SIGINT (`signals`, blocked by the caller): the follower keeps
// following so the leader can drain, and leaves after --drain-timeout + 5 s if the leader has not shut it down.
absl::Status RunFollowerRank(const WorkerOptions& o, const sigset_t& signals,
                             const std::function<absl::Status(int grpc_port)>& on_ready);

}  // namespace dsv4::worker
