// dsv4-group: one tensor-parallel group of T ranks as T dsv4-worker processes on one machine (one container, one
// Kubernetes pod holding T GPUs), so NCCL reaches every GPU of the group over NVLink / PCIe P2P; ranks in separate
// pods each see one GPU and would fall back to sockets. This file builds each rank's command line from the one the
// operator wrote; group_main.cc starts and supervises the processes (docs/deploy.md, docs/tensor-parallel.md).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dsv4::worker {

// The worker flags the launcher writes itself (per rank); an operator's command line must not carry them.
inline constexpr const char* kGroupOwnedFlags[] = {"rank", "world", "device", "host", "leader"};
// Flags only the leader keeps: followers listen on a loopback port of their own and export no metrics.
inline constexpr const char* kLeaderOnlyFlags[] = {"listen", "metrics-listen", "health-listen", "ready-file"};

// Each rank's dsv4-worker arguments (without the binary), rank 0 first, from the group's `worker_flags` (every one
// written --name=value or --name for a boolean; --listen required with a fixed port, which followers dial on
// loopback when it names all interfaces or localhost). Rank r gets --rank=r --world=world --device=r
// --host=127.0.0.1; followers --leader=<leader> --listen=127.0.0.1:0. InvalidArgument names the flag at fault.
absl::StatusOr<std::vector<std::vector<std::string>>> GroupRankArgs(int world,
                                                                    const std::vector<std::string>& worker_flags);

}  // namespace dsv4::worker
