// dsv4-coordinator: the gateway-facing gRPC server that shards requests across worker groups.
//
//   dsv4-coordinator --listen 0.0.0.0:50051 --workers dsv4-leaders.ns.svc:50061 --metrics-listen 0.0.0.0:9400
//   dsv4-coordinator --listen 127.0.0.1:0 --workers 127.0.0.1:7001,127.0.0.1:7002 --ready-file /tmp/coord.ready
//
// SIGTERM / SIGINT: graceful drain (health NOT_SERVING, no new requests, in-flight ones finish within
// --drain-timeout), then exit 0. See docs/coordinator.md.
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/flag_help.h"
#include "common/logging.h"
#include "coordinator/group_pool.h"
#include "coordinator/dashed_flags.h"
#include "coordinator/server.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "host:port for the dsv4.v1.Coordinator API (port 0 = any free)");
ABSL_FLAG(std::string, workers, "",
          "comma-separated group leaders host:port; a DNS name resolving to many leaders (a Kubernetes headless "
          "service) counts each address as a group");
ABSL_FLAG(std::string, metrics_listen, "", "host:port for Prometheus /metrics (empty = none)");
ABSL_FLAG(std::string, ready_file, "",
          "once serving with --min-ready-groups ready, write 'grpc=HOST:PORT metrics=HOST:PORT' here (atomically)");
ABSL_FLAG(int, min_ready_groups, 1,
          "groups that must have been ready before health says SERVING and the ready file is written");
ABSL_FLAG(double, drain_timeout, 30.0, "seconds in-flight requests get to finish after SIGTERM");
ABSL_FLAG(int, poll_interval_ms, 100, "how often every group is polled with GetLoad");
ABSL_FLAG(int, health_timeout_ms, 1000,
          "health deadline: a group that does not answer GetLoad within this is not ready, and its streams that "
          "received nothing for as long move to another group (a hung worker)");
ABSL_FLAG(int, stream_idle_timeout_ms, 30000,
          "stream inactivity deadline: a stream that delivered a token and then nothing for this long moves to "
          "another group even while its group answers polls; 0 = off");
ABSL_FLAG(int, engine_stall_ms, 30000,
          "a group whose engine made no progress for this long while it has requests (a hung step behind live RPC "
          "threads) is not ready and its silent streams move to another group, first token or not; 0 = off");
ABSL_FLAG(int, max_attempts, 4, "upstream streams per request (the first plus failovers and retries)");
ABSL_FLAG(std::string, log_level, "info", "trace | debug | info | warn | error");
// Security (docs/security.md). All empty = plaintext and no authentication, as suits a local run.
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the API port; with --tls-key turns TLS on");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "", "require API clients' certificates signed by this PEM CA (mutual TLS)");
ABSL_FLAG(std::string, auth_token_file, "",
          "require 'authorization: Bearer <token>' on Generate/GetModelInfo, tokens one per line in this file");
ABSL_FLAG(std::string, worker_tls_ca, "", "PEM CA that signed the workers' certificates; turns TLS to workers on");
ABSL_FLAG(std::string, worker_tls_cert, "", "client certificate presented to workers (mutual TLS)");
ABSL_FLAG(std::string, worker_tls_key, "", "PEM private key of --worker-tls-cert");
ABSL_FLAG(std::string, worker_tls_server_name, "",
          "name the workers' certificates carry; empty = the host as written in --workers");
ABSL_FLAG(std::string, health_listen, "",
          "host:port of a plaintext port serving only grpc.health.v1.Health/Check (Kubernetes probes); empty = none");

namespace {

std::string HostOf(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  return colon == std::string::npos ? listen : listen.substr(0, colon);
}

bool WriteReadyFile(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << contents;
    if (!f.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "dsv4-coordinator: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  constexpr char kUsage[] =
      "dsv4-coordinator --listen HOST:PORT --workers HOST:PORT[,HOST:PORT...] (docs/coordinator.md)";
  dsv4::HandleHelpFlag(argc, argv, kUsage, "coordinator/main.cc");
  absl::SetProgramUsageMessage(kUsage);
  std::vector<std::string> flag_storage;
  dsv4::UnderscoreFlagNames(argc, argv, flag_storage);
  absl::ParseCommandLine(argc, argv);
  dsv4::InitLogging("coordinator", 0, absl::GetFlag(FLAGS_log_level));

  // Block the drain signals in every thread (gRPC's included) and take them synchronously below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::vector<std::string>> workers = dsv4::coordinator::ParseWorkerList(absl::GetFlag(FLAGS_workers));
  if (!workers.ok()) return Fail(std::string(workers.status().message()));
  if (absl::GetFlag(FLAGS_poll_interval_ms) < 1) return Fail("--poll-interval-ms must be >= 1");
  if (absl::GetFlag(FLAGS_drain_timeout) < 0) return Fail("--drain-timeout must be >= 0");
  if (absl::GetFlag(FLAGS_health_timeout_ms) < 1) return Fail("--health-timeout-ms must be >= 1");
  if (absl::GetFlag(FLAGS_stream_idle_timeout_ms) < 0) return Fail("--stream-idle-timeout-ms must be >= 0 (0 = off)");
  if (absl::GetFlag(FLAGS_engine_stall_ms) < 0) return Fail("--engine-stall-ms must be >= 0 (0 = off)");
  dsv4::coordinator::CoordinatorOptions options{
      .listen = absl::GetFlag(FLAGS_listen),
      .workers = *workers,
      .metrics_listen = absl::GetFlag(FLAGS_metrics_listen),
      .poll_interval = absl::Milliseconds(absl::GetFlag(FLAGS_poll_interval_ms)),
      .poll_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_health_timeout_ms)),
      .stream_idle_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_stream_idle_timeout_ms)),
      .engine_stall = absl::Milliseconds(absl::GetFlag(FLAGS_engine_stall_ms)),
      .max_attempts = absl::GetFlag(FLAGS_max_attempts),
      .min_ready_groups = absl::GetFlag(FLAGS_min_ready_groups)};
  options.tls = {.cert_file = absl::GetFlag(FLAGS_tls_cert),
                 .key_file = absl::GetFlag(FLAGS_tls_key),
                 .client_ca_file = absl::GetFlag(FLAGS_tls_client_ca)};
  options.worker_tls.ca_file = absl::GetFlag(FLAGS_worker_tls_ca);
  options.worker_tls.cert_file = absl::GetFlag(FLAGS_worker_tls_cert);
  options.worker_tls.key_file = absl::GetFlag(FLAGS_worker_tls_key);
  options.worker_tls.server_name = absl::GetFlag(FLAGS_worker_tls_server_name);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.health_listen = absl::GetFlag(FLAGS_health_listen);
  absl::StatusOr<std::unique_ptr<dsv4::coordinator::CoordinatorServer>> server =
      dsv4::coordinator::CoordinatorServer::Start(options);
  if (!server.ok()) return Fail(std::string(server.status().message()));

  if (const std::string path = absl::GetFlag(FLAGS_ready_file); !path.empty()) {
    const int want = absl::GetFlag(FLAGS_min_ready_groups);
    while (!(*server)->pool().WaitForReady(want, absl::Seconds(5))) {
      DSV4_LOG_INFO("coordinator: waiting for {} ready worker groups ({} now)", want, (*server)->pool().ReadyCount());
      timespec zero{0, 0};
      if (sigtimedwait(&signals, nullptr, &zero) > 0) {
        (*server)->Drain(absl::ZeroDuration());
        return 0;
      }
    }
    (*server)->RefreshHealth();  // SERVING before the ready file says so
    const std::string host = HostOf(options.listen);
    const std::string contents =
        absl::StrCat("grpc=", host, ":", (*server)->port(), " metrics=", HostOf(options.metrics_listen), ":",
                     (*server)->metrics_port(),
                     (*server)->health_port() == 0
                         ? ""
                         : absl::StrCat(" health=", HostOf(options.health_listen), ":", (*server)->health_port()),
                     "\n");
    if (!WriteReadyFile(path, contents)) return Fail(absl::StrCat("cannot write --ready-file ", path));
  }

  int sig = 0;
  sigwait(&signals, &sig);
  DSV4_LOG_INFO("coordinator: signal {}, draining", sig);
  (*server)->Drain(absl::Seconds(absl::GetFlag(FLAGS_drain_timeout)));
  server->reset();
  return 0;
}
