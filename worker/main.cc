// dsv4-worker: one rank of a worker group (tensor parallel, docs/tensor-parallel.md) serving dsv4.v1.Worker.
//
//   dsv4-worker --checkpoint DIR --listen 127.0.0.1:0 --backend cpu --max-batch 32 --max-context 4096
//     --kv-pages N --prefill-chunk 256 --mode exact --group G --rank 0 --world 1
//     --metrics-listen 127.0.0.1:0 --ready-file PATH --drain-timeout 30
//   world T > 1: rank 0 as above plus --host ADDR; ranks 1..T-1 with --rank r --world T --leader RANK0_HOST:PORT
//
// Start-up (rank 0): flags -> options check -> gRPC up, NOT_SERVING (world > 1: then the rendezvous store,
// then wait for every follower, --startup-timeout) -> load weights (the rank's shard) -> size and allocate KV pools ->
// start the engine -> health SERVING -> write the ready file "grpc=HOST:PORT metrics=HOST:PORT" (temp + rename).
// Followers: tp_group.h. Any failure before that prints one line naming the problem and exits non-zero.
// SIGTERM/SIGINT: health NOT_SERVING, stop admitting, finish in-flight requests within --drain-timeout (abort
// the rest), exit 0 (the lock-step leader's shutdown plan then releases the followers).
#include <atomic>
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include <algorithm>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/flag_help.h"
#include "common/grpc_listen.h"
#include "common/health_probe.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/tls_options.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "metrics/load_progress.h"
#include "metrics/phase_timer.h"
#include "metrics/serving_metrics.h"
#include "worker/dsv4_executor.h"
#include "worker/engine.h"
#include "worker/kv_manager.h"
#include "worker/memory_plan.h"
#include "worker/options.h"
#include "worker/service.h"
#include "worker/stall_watch.h"
#include "worker/tp_group.h"

namespace {
const dsv4::worker::WorkerOptions kDefaults;
}

ABSL_FLAG(std::string, checkpoint, kDefaults.checkpoint, "checkpoint folder (config.json, *.safetensors)");
ABSL_FLAG(std::string, listen, kDefaults.listen, "gRPC listen address host:port (port 0 picks one)");
ABSL_FLAG(std::string, backend, kDefaults.backend, "cpu | cuda");
ABSL_FLAG(int, device, kDefaults.device, "GPU ordinal (cuda backend)");
ABSL_FLAG(std::string, attention_kernel, kDefaults.attention_kernel,
          "cuda: sparse-MLA decode kernel of the FP8 attention, mma | simt");
ABSL_FLAG(std::string, weight_load, kDefaults.weight_load,
          "auto | mapped | streamed: how the weights reach the backend (auto: streamed from disk to a GPU when a rank "
          "reads >= 3 GB, mapped otherwise)");
ABSL_FLAG(bool, fuse_projections, kDefaults.fuse_projections,
          "the projections that read one input (wq_a, wkv, compressor and indexer projections; wq_b with the "
          "indexer's) run as one multi-weight launch each; false: one linear each (same maths, other sum order)");
ABSL_FLAG(bool, cuda_graphs, kDefaults.cuda_graphs,
          "cuda: decode-only steps replay one CUDA graph per batch bucket (false: the same padded steps run eagerly)");
ABSL_FLAG(double, gpu_memory_fraction, kDefaults.gpu_memory_fraction,
          "cuda: share of the GPU's memory for weights, workspace, graphs and KV pools (the pools take the rest)");
ABSL_FLAG(int, max_batch, kDefaults.max_batch, "running requests at most");
ABSL_FLAG(int, max_waiting, kDefaults.max_waiting, "queued requests before RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_context, kDefaults.max_context, "prompt + generated tokens per request");
ABSL_FLAG(int64_t, kv_pages, kDefaults.kv_pages, "pages per KV pool; 0 = size from --mem-fraction");
ABSL_FLAG(double, mem_fraction, kDefaults.mem_fraction, "cpu: share of MemAvailable for KV pools");
ABSL_FLAG(int, page_rows, kDefaults.page_rows, "rows per KV page");
ABSL_FLAG(int, prefill_chunk, kDefaults.prefill_chunk, "prefill tokens per engine step");
ABSL_FLAG(std::string, mode, kDefaults.mode, "exact | production");
ABSL_FLAG(int, threads, kDefaults.threads, "CPU threads for the model; 0 = all cores");
ABSL_FLAG(std::string, group, kDefaults.group, "worker group id (metric label)");
ABSL_FLAG(int, rank, kDefaults.rank, "rank inside the group");
ABSL_FLAG(int, world, kDefaults.world, "ranks in the tensor-parallel group (docs/tensor-parallel.md)");
ABSL_FLAG(std::string, host, kDefaults.host, "this rank's address the other ranks of the group reach");
ABSL_FLAG(std::string, leader, kDefaults.leader, "rank 0's gRPC host:port (required on ranks >= 1)");
ABSL_FLAG(double, startup_timeout, kDefaults.startup_timeout_s, "seconds for every rank to join the group");
ABSL_FLAG(double, comm_timeout, kDefaults.comm_timeout_s, "deadline of one collective, seconds");
ABSL_FLAG(std::string, metrics_listen, kDefaults.metrics_listen, "host:port for /metrics; empty = off");
ABSL_FLAG(std::string, ready_file, kDefaults.ready_file, "file to write 'grpc=HOST:PORT metrics=HOST:PORT' to");
ABSL_FLAG(double, drain_timeout, kDefaults.drain_timeout_s, "seconds to finish in-flight requests on SIGTERM");
ABSL_FLAG(double, stall_timeout, kDefaults.stall_timeout_s,
          "seconds without a finished step while there is work (a hung engine) before health turns NOT_SERVING, so "
          "a liveness probe restarts the process; 0 = off");
ABSL_FLAG(std::string, log_level, kDefaults.log_level, "trace | debug | info | warn | error");
ABSL_FLAG(int, phase_timing_every, kDefaults.phase_timing_every,
          "time the phases (dsv4_decode_gpu_seconds_total) of 1 step in N; needs --metrics-listen");
ABSL_FLAG(bool, validate_only, kDefaults.validate_only,
          "check the flags (not the checkpoint or the GPU), print the options, exit 0 (deploy/ manifests in CI)");
// Security (docs/security.md). All empty = plaintext, as suits a local run.
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the gRPC port (also a follower's client certificate)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "", "require client certificates signed by this PEM CA (mutual TLS)");
ABSL_FLAG(std::string, leader_tls_ca, "", "ranks >= 1: PEM CA that signed the leader's certificate (TLS on)");
ABSL_FLAG(std::string, leader_tls_server_name, "", "name the leader's certificate carries; empty = host of --leader");
ABSL_FLAG(std::string, health_listen, kDefaults.health_listen,
          "host:port of a plaintext port serving only grpc.health.v1.Health/Check (Kubernetes probes); empty = none");

namespace dsv4::worker {
namespace {

// given_flags: the flag names on the command line (absl names, '_' spelling).
WorkerOptions OptionsFromFlags(const std::set<std::string>& given_flags) {
  WorkerOptions o;
  o.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  o.listen = absl::GetFlag(FLAGS_listen);
  o.backend = absl::GetFlag(FLAGS_backend);
  o.device = absl::GetFlag(FLAGS_device);
  o.attention_kernel = absl::GetFlag(FLAGS_attention_kernel);
  o.weight_load = absl::GetFlag(FLAGS_weight_load);
  o.fuse_projections = absl::GetFlag(FLAGS_fuse_projections);
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  o.max_batch = absl::GetFlag(FLAGS_max_batch);
  o.max_waiting = absl::GetFlag(FLAGS_max_waiting);
  o.max_context = absl::GetFlag(FLAGS_max_context);
  o.kv_pages = absl::GetFlag(FLAGS_kv_pages);
  o.mem_fraction = absl::GetFlag(FLAGS_mem_fraction);
  o.mem_fraction_set = given_flags.count("mem_fraction") > 0;
  o.page_rows = absl::GetFlag(FLAGS_page_rows);
  o.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  o.mode = absl::GetFlag(FLAGS_mode);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.group = absl::GetFlag(FLAGS_group);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world = absl::GetFlag(FLAGS_world);
  o.host = absl::GetFlag(FLAGS_host);
  o.leader = absl::GetFlag(FLAGS_leader);
  o.startup_timeout_s = absl::GetFlag(FLAGS_startup_timeout);
  o.comm_timeout_s = absl::GetFlag(FLAGS_comm_timeout);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.ready_file = absl::GetFlag(FLAGS_ready_file);
  o.drain_timeout_s = absl::GetFlag(FLAGS_drain_timeout);
  o.stall_timeout_s = absl::GetFlag(FLAGS_stall_timeout);
  o.log_level = absl::GetFlag(FLAGS_log_level);
  o.phase_timing_every = absl::GetFlag(FLAGS_phase_timing_every);
  o.validate_only = absl::GetFlag(FLAGS_validate_only);
  o.tls = {.cert_file = absl::GetFlag(FLAGS_tls_cert),
           .key_file = absl::GetFlag(FLAGS_tls_key),
           .client_ca_file = absl::GetFlag(FLAGS_tls_client_ca)};
  o.leader_tls_ca = absl::GetFlag(FLAGS_leader_tls_ca);
  o.leader_tls_server_name = absl::GetFlag(FLAGS_leader_tls_server_name);
  o.health_listen = absl::GetFlag(FLAGS_health_listen);
  return o;
}

int64_t AvailableHostBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

absl::Status WriteReadyFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out.good()) return absl::InternalError(absl::StrCat("--ready-file: cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("--ready-file: cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "dsv4-worker: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kUnimplemented ? 2 : 1;
}

// Bytes of the checkpoint's weight files (*.safetensors), for the load gauges; 0 when unreadable.
int64_t CheckpointBytes(const std::string& dir) {
  std::error_code ec;
  int64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".safetensors") total += static_cast<int64_t>(entry.file_size(ec));
  }
  return ec ? 0 : total;
}

// Weight-load and graph-capture numbers for the start-up gauges.
struct LoadStats {
  double seconds = 0;
  int64_t bytes = 0;
  double capture_seconds = 0;
};

// Exports the memory plan and the capture times as start-up gauges.
void ExportStartup(metrics::ServingMetrics* metrics, const ExecutorMemory& m, const MemoryPlan& plan) {
  if (metrics == nullptr) return;
  for (const GraphCaptureReport::Bucket& b : plan.graphs.buckets) {
    metrics->SetGraphCaptureSeconds(b.bucket, b.warm_up_seconds + b.capture_seconds);
  }
  metrics->SetStartupMemory("weights", static_cast<double>(m.weights));
  metrics->SetStartupMemory("workspace", static_cast<double>(m.workspace));
  metrics->SetStartupMemory("state", static_cast<double>(m.state));
  metrics->SetStartupMemory("kv_cache", static_cast<double>(m.kv_cache));
  metrics->SetStartupMemory("graphs", static_cast<double>(plan.graphs.device_bytes));
  metrics->SetStartupMemory("budget", static_cast<double>(plan.budget_bytes));
}

// Loads the weights (this rank's shard when `group` is set, then wrapped in the lock-step leader whose
// on_failure is `on_group_failure`), plans the memory - KV pools sized and allocated, CUDA graphs captured, the
// table logged (memory_plan.h) - and starts the engine thread. The executor's phase timer (CUDA events on a GPU)
// feeds `metrics` when given.
absl::StatusOr<std::unique_ptr<Engine>> StartEngine(const WorkerOptions& o, metrics::ServingMetrics* metrics,
                                                    LoadStats* load, comm::Group* group,
                                                    std::function<void(const absl::Status&)> on_group_failure) {
  load->bytes = CheckpointBytes(o.checkpoint);
  // Progress lines (percent, GB/s) every 5 s of a long load: bytes are credited per main layer loaded.
  metrics::LoadProgress progress("weights", load->bytes);
  int64_t credited = 0;
  auto on_layer = [&](int done, int total) {
    const int64_t upto = load->bytes * done / std::max(total, 1);
    progress.Add(upto - credited);
    credited = upto;
  };
  Dsv4ExecutorOptions eo = ExecutorOptions(o);
  eo.phase_sink = metrics != nullptr ? metrics::SinkTo(metrics) : nullptr;
  eo.phase_timing_every = o.phase_timing_every;
  eo.on_layer_loaded = on_layer;
  eo.tp_comm = group != nullptr ? &group->data() : nullptr;
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<ModelExecutor> executor, LoadDsv4Executor(eo));
  LogResident(o);
  if (group != nullptr) executor = WrapLeader(std::move(executor), *group, o, std::move(on_group_failure));
  progress.Add(load->bytes - credited);
  load->seconds = progress.Finish();
  DSV4_ASSIGN_OR_RETURN(MemoryPlan plan,
                        PlanMemory(*executor, {.kv = {.page_rows = o.page_rows,
                                                      .max_batch = o.max_batch,
                                                      .max_context = o.max_context,
                                                      .kv_pages = o.kv_pages,
                                                      .mem_fraction = o.mem_fraction,
                                                      .available_bytes = AvailableHostBytes()},
                                               .gpu_memory_fraction = o.gpu_memory_fraction,
                                               .graph_buckets = GraphBuckets(o),
                                               .capture_graphs = o.cuda_graphs}));
  DSV4_LOG_INFO("KV pools: {}", plan.sizing.ToString());
  if (!plan.graphs.buckets.empty()) DSV4_LOG_INFO("CUDA graphs: {}", plan.graphs.ToString());
  load->capture_seconds = plan.graphs.seconds;
  ExportStartup(metrics, executor->Memory(), plan);
  auto engine = std::make_unique<Engine>(std::move(executor), plan.sizing,
                                         EngineOptions{.max_batch = o.max_batch,
                                                       .max_waiting = o.max_waiting,
                                                       .prefill_chunk = o.prefill_chunk,
                                                       .max_context = o.max_context},
                                         metrics);
  engine->Start();
  return engine;
}

// "grpc=HOST:PORT metrics=HOST:PORT[ health=HOST:PORT]\n" (metrics empty when --metrics-listen is off, health
// only with --health-listen).
std::string ReadyLine(const WorkerOptions& o, int grpc_port, const metrics::MetricsServer* metrics_server,
                      int health_port = 0) {
  std::string host, metrics_addr;
  int unused = 0;
  (void)ParseHostPort("--listen", o.listen, &host, &unused);
  if (metrics_server != nullptr) {
    std::string mhost;
    (void)ParseHostPort("--metrics-listen", o.metrics_listen, &mhost, &unused);
    metrics_addr = absl::StrCat(mhost, ":", metrics_server->port());
  }
  std::string health;
  if (health_port != 0) {
    std::string hhost;
    (void)ParseHostPort("--health-listen", o.health_listen, &hhost, &unused);
    health = absl::StrCat(" health=", hhost, ":", health_port);
  }
  return absl::StrCat("grpc=", host, ":", grpc_port, " metrics=", metrics_addr, health, "\n");
}

// The gRPC side, up before the engine (NOT_SERVING; Generate answers UNAVAILABLE until AttachEngine) so
// followers can rendezvous. Members are destroyed server first, then the service.
struct Frontend {
  // Set once the leader's rendezvous store exists; until then Worker.Rendezvous answers UNAVAILABLE (followers
  // retry). The store binds an ephemeral port, so it is made after --listen is bound: made first, it could take
  // a --listen port inside the ephemeral range (50051 is) and the server would fail to start.
  // Owned here, first member, so it is destroyed after the server that calls it.
  std::unique_ptr<comm::RendezvousLeader> rendezvous_owner;
  std::atomic<comm::RendezvousLeader*> rendezvous{nullptr};
  std::unique_ptr<WorkerService> service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<HealthProbeServer> health;  // --health-listen; destroyed before the server
  int port = 0;
};

absl::StatusOr<std::unique_ptr<Frontend>> StartFrontend(const WorkerOptions& o) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  auto f = std::make_unique<Frontend>();
  ServiceOptions service_options{.max_context = o.max_context,
                                 .world = o.world,
                                 .default_drain_timeout_s = o.drain_timeout_s,
                                 .on_drain = [f = f.get()] {
                                   f->server->GetHealthCheckService()->SetServingStatus(false);
                                 },
                                 .rendezvous = nullptr};
  if (o.world > 1) {
    service_options.rendezvous = [f = f.get()](const auto& request, auto* response) {
      comm::RendezvousLeader* leader = f->rendezvous.load();
      if (leader == nullptr) return absl::UnavailableError("the group leader is still starting its rendezvous store");
      return leader->Handle(request, response);
    };
  }
  f->service = std::make_unique<WorkerService>(nullptr, std::move(service_options));
  DSV4_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        MakeServerCredentials(o.tls, "worker gRPC port (dsv4.v1.Worker)"));
  grpc::ServerBuilder builder;
  DisallowPortSharing(builder);
  builder.AddListeningPort(o.listen, credentials, &f->port);
  builder.RegisterService(f->service.get());
  f->server = builder.BuildAndStart();
  DSV4_RETURN_IF_ERROR(CheckListening("--listen", o.listen, f->server != nullptr, f->port));
  f->server->GetHealthCheckService()->SetServingStatus(false);
  DSV4_ASSIGN_OR_RETURN(f->health, HealthProbeServer::Start(o.health_listen, *f->server));
  return f;
}

int Run(const WorkerOptions& o, const sigset_t& signals) {
  const absl::Time t_start = absl::Now();
  std::unique_ptr<metrics::MetricsServer> metrics_server;
  std::unique_ptr<metrics::ServingMetrics> serving_metrics;
  if (!o.metrics_listen.empty()) {
    auto server = metrics::MetricsServer::Start(o.metrics_listen);
    if (!server.ok()) return Fail(server.status());
    metrics_server = std::move(*server);
    int group = 0;
    if (!absl::SimpleAtoi(o.group, &group)) group = 0;
    serving_metrics = std::make_unique<metrics::ServingMetrics>(
        *metrics_server->registry(), metrics::Labels{.role = "worker", .group = group, .rank = o.rank});
  }
  auto frontend_or = StartFrontend(o);
  if (!frontend_or.ok()) return Fail(frontend_or.status());
  Frontend& frontend = **frontend_or;
  grpc::Server* server = frontend.server.get();
  const int port = frontend.port;
  // Later start-up failures stop the server first (in-flight calls end before the service goes away).
  auto fail = [server](const absl::Status& s) {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    return Fail(s);
  };
  // World > 1: the rendezvous store, made after --listen is bound (Frontend::rendezvous says why).
  auto rendezvous_or = MakeRendezvousLeader(o);
  if (!rendezvous_or.ok()) return fail(rendezvous_or.status());
  frontend.rendezvous_owner = std::move(*rendezvous_or);
  comm::RendezvousLeader* rendezvous = frontend.rendezvous_owner.get();
  frontend.rendezvous.store(rendezvous);

  std::optional<comm::Group> group;  // declared before the engine: the lock-step leader inside uses it
  if (rendezvous) {
    auto formed = rendezvous->FormGroup();  // DEADLINE_EXCEEDED naming the missing ranks after --startup-timeout
    if (!formed.ok()) return fail(formed.status());
    group = std::move(*formed);
  }
  LoadStats load;
  auto engine_or = StartEngine(o, serving_metrics.get(), &load, group ? &*group : nullptr,
                               [server](const absl::Status& s) {
                                 DSV4_LOG_ERROR("worker group broken: {}; health NOT_SERVING", s.ToString());
                                 server->GetHealthCheckService()->SetServingStatus(false);
                               });
  if (!engine_or.ok()) return fail(engine_or.status());
  Engine& engine = **engine_or;
  frontend.service->AttachEngine(&engine);
  server->GetHealthCheckService()->SetServingStatus(true);
  const std::string ready = ReadyLine(o, port, metrics_server.get(), frontend.health ? frontend.health->port() : 0);
  if (serving_metrics) {
    const double total_s = absl::ToDoubleSeconds(absl::Now() - t_start);
    serving_metrics->SetStartup(load.seconds, static_cast<double>(load.bytes), load.capture_seconds, total_s);
  }
  if (!o.ready_file.empty()) {
    if (absl::Status s = WriteReadyFile(o.ready_file, ready); !s.ok()) return Fail(s);
  }
  DSV4_LOG_INFO("SERVING {}", ready.substr(0, ready.size() - 1));
  std::optional<StallWatch> stall_watch;
  if (o.stall_timeout_s > 0 || serving_metrics != nullptr) {
    metrics::ServingMetrics* m = serving_metrics.get();
    stall_watch.emplace(
        [&engine] { return engine.GetLoad().seconds_since_progress(); }, absl::Seconds(o.stall_timeout_s),
        [server](double stalled_s) {
          DSV4_LOG_ERROR("engine made no progress for {:.1f} s with requests waiting (--stall-timeout): health "
                         "NOT_SERVING, for a liveness probe to restart this worker",
                         stalled_s);
          server->GetHealthCheckService()->SetServingStatus(false);
        },
        absl::Milliseconds(500), [m](double s) {
          if (m != nullptr) m->SetEngineHeartbeat(s);
        });
  }

  int sig = 0;
  sigwait(&signals, &sig);
  stall_watch.reset();  // a drain may take long steps of its own
  DSV4_LOG_INFO("signal {}: draining (timeout {:.1f} s)", sig, o.drain_timeout_s);
  server->GetHealthCheckService()->SetServingStatus(false);
  absl::Notification drained;
  engine.Drain(absl::Seconds(o.drain_timeout_s), [&drained](int, int) { drained.Notify(); });
  drained.WaitForNotification();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  engine.Stop();
  DSV4_LOG_INFO("exiting");
  return 0;
}

// Ranks >= 1 of a group: follow the leader's steps; the ready file names the follower's health endpoint.
int RunFollower(const WorkerOptions& o, const sigset_t& signals) {
  const absl::Status s = RunFollowerRank(o, signals, [&o](int port) {
    return o.ready_file.empty() ? absl::OkStatus() : WriteReadyFile(o.ready_file, ReadyLine(o, port, nullptr));
  });
  return s.ok() ? 0 : Fail(s);
}

}  // namespace
}  // namespace dsv4::worker

int main(int argc, char** argv) {
  // Block SIGTERM/SIGINT before any thread starts, so every thread inherits the mask and sigwait sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  constexpr char kUsage[] = "dsv4-worker --checkpoint DIR [flags]: DeepSeek-V4 decode worker (docs/worker.md)";
  dsv4::HandleHelpFlag(argc, argv, kUsage, "worker/main.cc");
  absl::SetProgramUsageMessage(kUsage);
  // The documented spelling is --max-batch; absl flag names are identifiers, so '-' in a name becomes '_'.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> argp;
  std::set<std::string> given;  // flag names as written (absl's build has no public "was it set")
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& a = args[i];
    if (i > 0 && a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t j = 2; j < end; ++j) {
        if (a[j] == '-') a[j] = '_';
      }
      given.insert(a.substr(2, end - 2));
    }
    argp.push_back(a.data());
  }
  // Unknown flags end here (absl prints them and exits 1); a stray positional argument (a flag whose '=' went
  // missing in a manifest, say) is refused below rather than ignored.
  const std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(argp.size()), argp.data());
  if (positional.size() > 1) {
    return dsv4::worker::Fail(absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", positional[1], "' (flags are --name=value or --name value)")));
  }
  const dsv4::worker::WorkerOptions options = dsv4::worker::OptionsFromFlags(given);
  if (absl::Status s = dsv4::worker::ValidateOptions(options); !s.ok()) return dsv4::worker::Fail(s);
  if (options.validate_only) {
    std::printf("dsv4-worker: flags OK: %s\n", dsv4::worker::DescribeOptions(options).c_str());
    return 0;
  }
  dsv4::InitLogging("worker", options.rank, options.log_level);
  if (options.rank > 0) return dsv4::worker::RunFollower(options, signals);
  return dsv4::worker::Run(options, signals);
}
