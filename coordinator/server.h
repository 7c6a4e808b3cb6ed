// CoordinatorServer: the dsv4.v1.Coordinator gRPC server (Generate, GetModelInfo), with the standard
// grpc.health.v1 service and server reflection, its GroupPool, and its Prometheus metrics. dsv4-coordinator
// (main.cc) is a thin shell around it; tests run it in-process.
// Security (docs/security.md): optional TLS on the API port, TLS (and a client certificate) towards the
// workers, bearer tokens on Generate and GetModelInfo (health and reflection need none), and an optional
// plaintext health-only port for Kubernetes probes.
//
// Threads: gRPC's callback threads run every RPC; GroupPool owns a watcher thread; a stats thread refreshes
// health and the gauges every 200 ms. Drain() is called from one control thread (main's signal waiter or a test).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/bearer_tokens.h"
#include "common/health_probe.h"
#include "common/tls_options.h"
#include "coordinator/generate_call.h"
#include "coordinator/group_pool.h"
#include "coordinator/stream_watchdog.h"
#include "dsv4/v1/coordinator.grpc.pb.h"
#include "grpcpp/server.h"
#include "metrics/serving_metrics.h"

namespace dsv4::coordinator {

struct CoordinatorOptions {
  std::string listen = "0.0.0.0:50051";      // host:port; port 0 picks a free one
  std::vector<std::string> workers;          // group leaders (host:port, DNS names may resolve to many)
  std::string metrics_listen;                // host:port for /metrics; empty = no metrics endpoint
  absl::Duration poll_interval = absl::Milliseconds(100);
  // Health deadline: a group whose GetLoad poll does not answer within this is not ready, and its streams
  // silent for as long are failed over (a hung worker; stream_watchdog.h).
  absl::Duration poll_timeout = absl::Seconds(1);
  // Stream inactivity deadline after a stream's first message; zero = off.
  absl::Duration stream_idle_timeout = absl::Seconds(30);
  // Engine stall deadline: a group whose engine reports no progress for this long while it has requests
  // (GetLoadResponse.seconds_since_progress) is not ready, and its silent streams fail over - also those still
  // waiting for their first token, which the inactivity deadline leaves alone. Zero = off.
  absl::Duration engine_stall = absl::Seconds(30);
  int max_attempts = 4;                      // upstream streams per request (first + failovers/retries)
  // Health ("" service) turns SERVING once this many groups were ready (start-up gate; it stays SERVING
  // while groups come and go, so liveness probes do not restart a coordinator for its workers' sake).
  // The "dsv4.v1.Coordinator" service's health follows "at least one group ready" at every moment.
  int min_ready_groups = 0;
  uint64_t route_seed = 0;                   // power-of-two-choices RNG; 0 = from the clock
  ServerTlsOptions tls{};                    // --tls-cert/--tls-key/--tls-client-ca; empty = plaintext API
  ClientTlsOptions worker_tls{};             // --worker-tls-*: dialling workers; empty = plaintext
  std::string auth_token_file{};             // --auth-token-file: bearer tokens the API needs; empty = none
  std::string health_listen{};               // --health-listen: plaintext Health/Check-only port; empty = none
};

class CoordinatorServer {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorOptions& options);
  ~CoordinatorServer();  // shuts down at once (in-flight calls are cancelled)

  int port() const { return port_; }
  int metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }
  int health_port() const { return health_probe_ ? health_probe_->port() : 0; }
  GroupPool& pool() { return *pool_; }
  const CallTracker& tracker() const { return tracker_; }

  // Re-evaluates health from the groups' readiness now (the stats thread does it every 200 ms).
  void RefreshHealth();

  // Graceful drain: health NOT_SERVING, no new admissions (UNAVAILABLE), in-flight calls run to their end
  // for up to `timeout`, then the server shuts down, cancelling what is left. Returns how many calls were
  // still in flight when the timeout cut them off (0 = a clean drain). Idempotent.
  int Drain(absl::Duration timeout);

 private:
  class Service;
  CoordinatorServer() = default;
  void StatsLoop();
  void UpdateGauges();

  CoordinatorOptions options_;
  std::unique_ptr<metrics::MetricsServer> metrics_server_;
  std::unique_ptr<metrics::ServingMetrics> metrics_;
  prometheus::Counter* failovers_ = nullptr;
  prometheus::Counter* failover_prompt_tokens_ = nullptr;
  prometheus::Gauge* ready_groups_ = nullptr;
  prometheus::Gauge* ready_checkpoints_ = nullptr;
  int last_ready_checkpoints_ = 1;  // stats thread only: logs a change to > 1 once
  std::unique_ptr<StreamWatchdog> watchdog_;  // outlives the pool, whose poll callbacks call it
  std::unique_ptr<GroupPool> pool_;
  CallTracker tracker_;
  CallEnv env_;
  std::unique_ptr<Service> service_;
  std::optional<BearerTokens> tokens_;  // set with --auth-token-file
  prometheus::Counter* unauthenticated_ = nullptr;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HealthProbeServer> health_probe_;  // destroyed before server_
  int port_ = 0;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread stats_;
};

}  // namespace dsv4::coordinator
