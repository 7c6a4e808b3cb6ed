// See server.h: building the Coordinator gRPC server, its health/reflection services, metrics and drain.
#include "coordinator/server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_listen.h"
#include "common/logging.h"
#include "common/raw_rpc.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"

namespace dsv4::coordinator {

// Both methods are raw (common/raw_rpc.h): the handlers decode the request themselves, so one that does not
// decode gets INVALID_ARGUMENT instead of gRPC's own UNIMPLEMENTED with no message. Both check the bearer token
// first (UNAUTHENTICATED before anything else is looked at).
class CoordinatorServer::Service final
    : public dsv4::v1::Coordinator::WithRawCallbackMethod_Generate<
          dsv4::v1::Coordinator::WithRawCallbackMethod_GetModelInfo<dsv4::v1::Coordinator::Service>> {
 public:
  Service(CallEnv* env, const BearerTokens* tokens, prometheus::Counter* unauthenticated)
      : env_(env), tokens_(tokens), unauthenticated_(unauthenticated) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* bytes) override {
    if (grpc::Status auth = Authenticate(*ctx); !auth.ok()) {  // finishes at once, deletes itself
      return new GenerateCall(env_, ctx, absl::Status(static_cast<absl::StatusCode>(auth.error_code()),
                                                      auth.error_message()));
    }
    dsv4::v1::GenerateRequest request;
    absl::Status parsed = ParseRequest(*bytes, &request);
    if (!parsed.ok()) return new GenerateCall(env_, ctx, std::move(parsed));  // deletes itself
    return new GenerateCall(env_, ctx, std::move(request));
  }

  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
                                         grpc::ByteBuffer* out) override {
    auto* call = new UnaryCall<dsv4::v1::GetModelInfoRequest, dsv4::v1::GetModelInfoResponse>(in, out);
    if (!call->parsed()) return call;
    if (grpc::Status auth = Authenticate(*ctx); !auth.ok()) {
      call->Reply(auth);
      return call;
    }
    std::optional<dsv4::v1::GetModelInfoResponse> info = env_->pool->ModelInfo();
    if (!info.has_value()) {
      call->Reply(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                               "no worker group has reported its model yet (see the coordinator log)"));
      return call;
    }
    *call->response() = *info;
    call->Reply(grpc::Status::OK);
    return call;
  }

 private:
  // OK without --auth-token-file; else the token check. The log line names the peer, never the token.
  grpc::Status Authenticate(const grpc::CallbackServerContext& ctx) const {
    if (tokens_ == nullptr) return grpc::Status::OK;
    grpc::Status s = tokens_->Check(ctx.client_metadata());
    if (!s.ok()) {
      if (unauthenticated_ != nullptr) unauthenticated_->Increment();
      DSV4_LOG_DEBUG("coordinator: refused {}: {}", ctx.peer(), s.error_message());
    }
    return s;
  }

  CallEnv* const env_;
  const BearerTokens* const tokens_;             // null = no authentication
  prometheus::Counter* const unauthenticated_;  // may be null (no metrics)
};

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const CoordinatorOptions& options) {
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--max-attempts = ", options.max_attempts, " must be >= 1"));
  }
  // Credentials and tokens first: a bad file ends start-up before anything listens.
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls, "coordinator API (dsv4.v1.Coordinator)");
  if (!credentials.ok()) return credentials.status();
  ClientTlsOptions worker_tls = options.worker_tls;
  worker_tls.flag_prefix = "--worker-tls-";
  absl::StatusOr<ChannelSecurity> to_workers = MakeChannelSecurity(worker_tls, "coordinator -> workers");
  if (!to_workers.ok()) return to_workers.status();
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->options_ = options;
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<BearerTokens> tokens = BearerTokens::Load("--auth-token-file", options.auth_token_file);
    if (!tokens.ok()) return tokens.status();
    s->tokens_ = *std::move(tokens);
    DSV4_LOG_INFO("coordinator API: bearer tokens required on Generate and GetModelInfo ({} tokens from {})",
                  s->tokens_->size(), options.auth_token_file);
    if (!options.tls.enabled()) {
      DSV4_LOG_WARN("coordinator API: bearer tokens on a plaintext port cross the network readable (set --tls-cert "
                    "and --tls-key unless TLS ends in front of this process)");
    }
  } else {
    DSV4_LOG_INFO("coordinator API: no authentication (set --auth-token-file to require bearer tokens)");
  }
  const metrics::Labels labels{.role = "coordinator", .group = 0, .rank = 0};
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<metrics::MetricsServer>> m = metrics::MetricsServer::Start(options.metrics_listen);
    if (!m.ok()) return m.status();
    s->metrics_server_ = *std::move(m);
    prometheus::Registry& registry = *s->metrics_server_->registry();
    s->metrics_ = std::make_unique<metrics::ServingMetrics>(registry, labels, metrics::SeriesSet::kCoordinator);
    const std::map<std::string, std::string> l{
        {"role", labels.role}, {"group", std::to_string(labels.group)}, {"rank", std::to_string(labels.rank)}};
    s->failovers_ = &prometheus::BuildCounter()
                         .Name("dsv4_coordinator_failovers_total")
                         .Help("Requests resubmitted to another worker group after their group failed mid-stream")
                         .Register(registry)
                         .Add(l);
    s->failover_prompt_tokens_ =
        &prometheus::BuildCounter()
             .Name("dsv4_coordinator_failover_prompt_tokens_total")
             .Help("Prompt tokens a worker group prefilled again for a failed-over request (the original prompt "
                   "plus the tokens already streamed)")
             .Register(registry)
             .Add(l);
    s->ready_groups_ = &prometheus::BuildGauge()
                            .Name("dsv4_coordinator_ready_groups")
                            .Help("Worker groups the coordinator currently routes to")
                            .Register(registry)
                            .Add(l);
    s->ready_checkpoints_ = &prometheus::BuildGauge()
                                 .Name("dsv4_coordinator_ready_checkpoints")
                                 .Help("Distinct checkpoints among the ready worker groups (1 normally; more during "
                                       "a rolling upgrade, and failovers then stay on the checkpoint that began a "
                                       "stream)")
                                 .Register(registry)
                                 .Add(l);
    s->unauthenticated_ = &prometheus::BuildCounter()
                               .Name("dsv4_coordinator_unauthenticated_total")
                               .Help("API calls refused for a missing or invalid bearer token")
                               .Register(registry)
                               .Add(l);
  }

  if (options.poll_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--health-timeout-ms must be >= 1");
  }
  s->watchdog_ = std::make_unique<StreamWatchdog>(options.stream_idle_timeout);
  const absl::Duration health = options.poll_timeout;
  GroupPoolOptions pool_options{
      .targets = options.workers,
      .poll_interval = options.poll_interval,
      .rpc_timeout = health,
      .engine_stall = options.engine_stall,
      .seed = options.route_seed != 0 ? options.route_seed : static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())),
      // A group that missed its health deadline: its streams silent for as long are hung with it.
      .on_unanswered = [w = s->watchdog_.get(), health](const std::string& address, const std::string& why) {
        const int n = w->AbandonSilent(address, health, why);
        if (n > 0) DSV4_LOG_WARN("coordinator: group {}: {}; failing over its {} silent streams", address, why, n);
      },
      .security = *std::move(to_workers)};
  s->pool_ = std::make_unique<GroupPool>(std::move(pool_options));
  if (absl::Status st = s->pool_->Start(); !st.ok()) return st;
  s->env_ = CallEnv{.pool = s->pool_.get(),
                    .tracker = &s->tracker_,
                    .metrics = s->metrics_.get(),
                    .failovers = s->failovers_,
                    .failover_prompt_tokens = s->failover_prompt_tokens_,
                    .watchdog = s->watchdog_.get(),
                    .max_attempts = options.max_attempts};
  s->service_ = std::make_unique<Service>(&s->env_, s->tokens_ ? &*s->tokens_ : nullptr, s->unauthenticated_);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  DisallowPortSharing(builder);
  builder.AddListeningPort(options.listen, *credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (absl::Status st = CheckListening("--listen", options.listen, s->server_ != nullptr, s->port_); !st.ok()) {
    return st;
  }
  s->server_->GetHealthCheckService()->SetServingStatus(false);
  absl::StatusOr<std::unique_ptr<HealthProbeServer>> probe = HealthProbeServer::Start(options.health_listen, *s->server_);
  if (!probe.ok()) return probe.status();
  s->health_probe_ = *std::move(probe);
  s->RefreshHealth();
  s->stats_ = std::thread([p = s.get()] { p->StatsLoop(); });
  DSV4_LOG_INFO("coordinator: serving dsv4.v1.Coordinator on port {} ({} worker targets, {} ready)", s->port_,
                options.workers.size(), s->pool_->ReadyCount());
  return s;
}

void CoordinatorServer::StatsLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Milliseconds(200))) return;
    }
    RefreshHealth();
    UpdateGauges();
  }
}

void CoordinatorServer::RefreshHealth() {
  const int ready = pool_->ReadyCount();
  absl::MutexLock lock(&mu_);
  if (draining_ || shut_down_) return;
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (!serving_ && ready >= options_.min_ready_groups) {
    serving_ = true;
    health->SetServingStatus("", true);
    DSV4_LOG_INFO("coordinator: SERVING ({} groups ready)", ready);
  }
  health->SetServingStatus(dsv4::v1::Coordinator::service_full_name(), ready > 0);
}

void CoordinatorServer::UpdateGauges() {
  if (metrics_ == nullptr) return;
  double kv = 0;
  int64_t waiting = 0;
  int ready = 0;
  for (const GroupStatus& g : pool_->Snapshot()) {
    if (!g.ready) continue;
    ++ready;
    kv = std::max(kv, g.load.kv_usage_ratio());
    waiting += g.load.waiting();
  }
  // The coordinator queues nothing itself: "running" is its in-flight calls, "waiting" the groups' queues.
  metrics_->SetRunning(tracker_.inflight());
  metrics_->SetWaiting(static_cast<int>(waiting));
  metrics_->SetKvUsage(kv);
  ready_groups_->Set(ready);
  const int checkpoints = pool_->ReadyCheckpoints();
  ready_checkpoints_->Set(checkpoints);
  if (checkpoints > 1 && checkpoints != last_ready_checkpoints_) {
    DSV4_LOG_WARN("coordinator: the ready worker groups serve {} different checkpoints (see GetModelInfo's "
                  "checkpoint_fingerprint per group); failovers stay on the checkpoint that began each stream",
                  checkpoints);
  }
  last_ready_checkpoints_ = checkpoints;
}

int CoordinatorServer::Drain(absl::Duration timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return 0;
  }
  DSV4_LOG_INFO("coordinator: draining ({} in flight, timeout {})", tracker_.inflight(), absl::FormatDuration(timeout));
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
  }
  server_->GetHealthCheckService()->SetServingStatus(false);  // every service
  tracker_.StopAdmitting();
  const bool idle = tracker_.WaitIdle(timeout);
  const int left = idle ? 0 : tracker_.inflight();
  if (!idle) DSV4_LOG_WARN("coordinator: drain timeout with {} calls in flight; cancelling them", left);
  server_->Shutdown(std::chrono::system_clock::now());
  {
    absl::MutexLock lock(&mu_);
    shut_down_ = true;
  }
  DSV4_LOG_INFO("coordinator: drained");
  return left;
}

CoordinatorServer::~CoordinatorServer() {
  bool need_shutdown = false;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    need_shutdown = !shut_down_;
    shut_down_ = true;
  }
  if (stats_.joinable()) stats_.join();
  if (server_ != nullptr) {
    if (need_shutdown) server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
  // Calls cancelled by the shutdown end their worker streams before the pool (and its stubs) go away.
  tracker_.WaitIdle(absl::Seconds(5));
}

}  // namespace dsv4::coordinator
