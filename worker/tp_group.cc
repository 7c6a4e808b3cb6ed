// See tp_group.h.
#include "worker/tp_group.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_listen.h"
#include "common/health_probe.h"
#include "model/dsv4/shard.h"
#include "worker/lockstep.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "worker/dsv4_executor.h"
#include "worker/service.h"

namespace dsv4::worker {
namespace {

std::chrono::milliseconds Ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

// SIGTERM on a follower: the leader drains (up to --drain-timeout) and then sends its shutdown plan, which
// ends RunFollower; leave on our own only if that does not come.
void WatchSignals(const sigset_t& signals, double drain_timeout_s, int rank) {
  std::thread([signals, drain_timeout_s, rank] {
    int sig = 0;
    sigwait(&signals, &sig);
    DSV4_LOG_INFO("rank {}: signal {}: following the leader's drain for at most {:.1f} s", rank, sig,
                  drain_timeout_s + 5);
    std::this_thread::sleep_for(Ms(drain_timeout_s + 5));
    DSV4_LOG_INFO("rank {}: the leader did not shut the group down; leaving", rank);
    std::_Exit(0);
  }).detach();
}

}  // namespace

absl::StatusOr<comm::GroupOptions> MakeGroupOptions(const WorkerOptions& o) {
  comm::GroupOptions g;
  g.rank = o.rank;
  g.world = o.world;
  DSV4_ASSIGN_OR_RETURN(g.checkpoint_fingerprint, comm::CheckpointFingerprint(o.checkpoint));
  g.host = o.host;
  g.leader_addr = o.leader;
  DSV4_ASSIGN_OR_RETURN(g.leader_security,
                        MakeChannelSecurity(LeaderTlsOptions(o), o.rank > 0 ? "this rank -> its leader" : ""));
  g.comm.timeout = Ms(o.comm_timeout_s);
  g.comm.startup_timeout = Ms(o.startup_timeout_s);
  // A GPU group's activations are device buffers: its forward's collectives go through NCCL (on the CUDA backend's
  // stream, worker/nccl_collectives.h); step plans and heartbeats stay on Gloo.
  g.use_nccl = o.backend == "cuda";
  g.cuda_device = o.device;
  return g;
}

absl::StatusOr<std::unique_ptr<comm::RendezvousLeader>> MakeRendezvousLeader(const WorkerOptions& o) {
  if (o.world == 1) return std::unique_ptr<comm::RendezvousLeader>();
  DSV4_ASSIGN_OR_RETURN(comm::GroupOptions g, MakeGroupOptions(o));
  DSV4_ASSIGN_OR_RETURN(auto leader, comm::RendezvousLeader::Create(g));
  DSV4_LOG_INFO("group leader of world {}: checkpoint {}, rendezvous store {}", o.world, g.checkpoint_fingerprint,
                leader->store_address());
  return leader;
}

void LogResident(const WorkerOptions& o) {
  DSV4_LOG_INFO("tensor parallel rank {} of {} loaded: resident {} MiB", o.rank, o.world,
                model::ResidentBytes() >> 20);
}

std::unique_ptr<ModelExecutor> WrapLeader(std::unique_ptr<ModelExecutor> local, comm::Group& group,
                                          const WorkerOptions& o, std::function<void(const absl::Status&)> on_failure) {
  // Heartbeats keep idle followers' receives inside their deadline and find a dead follower within one interval.
  const auto interval = std::min(std::chrono::milliseconds(1000), Ms(o.comm_timeout_s / 4));
  return std::make_unique<LockstepLeader>(
      std::move(local), group.control.get(),
      LockstepOptions{.heartbeat_interval = interval, .on_failure = std::move(on_failure)});
}

absl::Status RunFollowerRank(const WorkerOptions& o, const sigset_t& signals,
                             const std::function<absl::Status(int grpc_port)>& on_ready) {
  DSV4_ASSIGN_OR_RETURN(comm::GroupOptions g, MakeGroupOptions(o));
  // Health and a Rendezvous that refuses ("not the leader"), so a misdirected follower learns why.
  grpc::EnableDefaultHealthCheckService(true);
  ServiceOptions service_options;
  service_options.max_context = o.max_context;
  service_options.world = o.world;
  WorkerService service(nullptr, std::move(service_options));
  DSV4_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        MakeServerCredentials(o.tls, absl::StrCat("rank ", o.rank, " gRPC port (health)")));
  grpc::ServerBuilder builder;
  int port = 0;
  DisallowPortSharing(builder);
  builder.AddListeningPort(o.listen, credentials, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  DSV4_RETURN_IF_ERROR(CheckListening("--listen", o.listen, server != nullptr, port));
  server->GetHealthCheckService()->SetServingStatus(false);
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<HealthProbeServer> probe, HealthProbeServer::Start(o.health_listen, *server));
  WatchSignals(signals, o.drain_timeout_s, o.rank);

  DSV4_LOG_INFO("rank {} of {}: joining the group at {} (checkpoint {})", o.rank, o.world, o.leader,
                g.checkpoint_fingerprint);
  DSV4_ASSIGN_OR_RETURN(comm::Group group, comm::JoinGroup(g));
  Dsv4ExecutorOptions eo = ExecutorOptions(o);
  eo.tp_comm = &group.data();
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> local, LoadDsv4Executor(eo));
  LogResident(o);
  server->GetHealthCheckService()->SetServingStatus(true);
  DSV4_RETURN_IF_ERROR(on_ready(port));
  const absl::Status s = RunFollower(*group.control, *local);
  server->GetHealthCheckService()->SetServingStatus(false);
  probe.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (s.ok()) DSV4_LOG_INFO("rank {}: the leader shut the group down; exiting", o.rank);
  return s;
}

}  // namespace dsv4::worker
