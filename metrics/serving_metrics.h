// Prometheus metrics for every dsv4 process (coordinator and each worker rank).
//
// MetricsServer serves /metrics over HTTP (prometheus-cpp Exposer) on --metrics-listen; ServingMetrics owns the
// series of ARCHITECTURE.md section 4, each carrying the labels {role, group, rank} so that the ranks of one
// tensor-parallel group are never reported as one series. Names follow vLLM/SGLang with the prefix dsv4_.
//
// Threads: MetricsServer runs its own HTTP threads (civetweb, 2). ServingMetrics is thread-safe: any thread may
// call any method (prometheus-cpp counters/gauges/histograms are atomic; the phase-share state has a mutex).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dsv4::metrics {

// The identity put on every series. role: "coordinator" | "worker"; group: worker group (replica) index;
// rank: tensor-parallel rank inside the group (0 = leader; the coordinator uses 0).
struct Labels {
  std::string role;
  int group = 0;
  int rank = 0;
};

// Phases of one decode step, the values of label phase on dsv4_decode_gpu_seconds_total.
enum class Phase { kAttention, kMoe, kDense, kComm, kOther };
inline constexpr int kNumPhases = 5;
// "attention" | "moe" | "dense" | "comm" | "other".
std::string_view PhaseName(Phase p);

// Histogram buckets fitted to LLM serving (seconds): TTFT 5 ms .. 60 s, ITL 1 ms .. 2 s, e2e 10 ms .. 600 s,
// decode batch size 1 .. 1024. Exposed for tests and for the dashboard's documentation.
const std::vector<double>& TtftBuckets();
const std::vector<double>& ItlBuckets();
const std::vector<double>& E2eBuckets();
const std::vector<double>& BatchSizeBuckets();

// An HTTP endpoint /metrics serving one registry. listen_addr is "host:port" (port 0 picks a free port,
// IPv6 as "[::1]:port"). Stops serving when destroyed.
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen_addr);
  ~MetricsServer();

  // The bound port (the chosen one when listen_addr asked for port 0).
  int port() const { return port_; }
  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::shared_ptr<prometheus::Registry> registry,
                int port);
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  int port_;
};

// Which series a process exports. A worker rank exports all of them. The coordinator runs no engine, so it
// leaves out the engine series (dsv4_decode_batch_size, dsv4_decode_gpu_seconds_total,
// dsv4_attention_time_share, dsv4_startup_*) that would otherwise sit at 0 beside the workers' real ones; the
// methods that feed them do nothing there.
enum class SeriesSet { kWorker, kCoordinator };

// The serving series of one process. Create one per process on the MetricsServer's registry.
class ServingMetrics {
 public:
  ServingMetrics(prometheus::Registry& registry, const Labels& labels, SeriesSet series = SeriesSet::kWorker);
  ServingMetrics(const ServingMetrics&) = delete;
  ServingMetrics& operator=(const ServingMetrics&) = delete;

  void SetRunning(int n);        // dsv4_num_requests_running
  void SetWaiting(int n);        // dsv4_num_requests_waiting
  void SetKvUsage(double ratio);  // dsv4_kv_cache_usage_ratio, 0..1
  void ObserveBatchSize(int b);  // dsv4_decode_batch_size, one observation per decode step
  // dsv4_engine_seconds_since_progress: the engine heartbeat (GetLoadResponse.seconds_since_progress), sampled
  // twice a second by the worker's StallWatch; 0 when idle.
  void SetEngineHeartbeat(double seconds);

  // dsv4_prompt_tokens_total: prompt tokens prefilled, counted when a request's first token is sampled (worker)
  // or arrives (coordinator). A worker counts the prompt it was sent (after a failover: the original prompt plus
  // the resumed tokens); the coordinator counts the client's prompt once per request and the re-prefilled
  // prompts of failovers in dsv4_coordinator_failover_prompt_tokens_total (docs/metrics.md).
  void AddPromptTokens(int64_t n);
  void AddGenerationTokens(int64_t n);  // dsv4_generation_tokens_total

  void ObserveTtft(double s);  // dsv4_time_to_first_token_seconds
  void ObserveItl(double s);   // dsv4_inter_token_latency_seconds
  void ObserveE2e(double s);   // dsv4_e2e_request_latency_seconds

  // dsv4_request_finished_total{reason}; reason: "stop" | "length" | "abort" | "error" (others count as "error").
  void RequestFinished(std::string_view reason);

  // dsv4_decode_gpu_seconds_total{phase} += s, and updates dsv4_attention_time_share: attention seconds over all
  // phase seconds, both decayed with a 60 s time constant so the gauge follows the recent mix.
  void AddPhaseSeconds(Phase p, double s);

  // Start-up gauges: dsv4_startup_weight_load_seconds, dsv4_startup_weight_load_bytes,
  // dsv4_startup_weight_load_bytes_per_second, dsv4_startup_graph_capture_seconds, dsv4_startup_total_seconds.
  void SetStartup(double load_s, double load_bytes, double capture_s, double total_s);
  // dsv4_startup_graph_capture_bucket_seconds{bucket}: one decode bucket's CUDA graph (warm-up step + capture).
  void SetGraphCaptureSeconds(int bucket, double s);
  // dsv4_startup_memory_bytes{kind}: the start-up memory plan (weights, workspace, state, kv_cache, graphs,
  // budget; device memory on a GPU worker, host memory on a CPU one).
  void SetStartupMemory(std::string_view kind, double bytes);

  double attention_time_share() const;  // the gauge's current value (0 without the engine series)

  // Also exported, set once by the constructor: dsv4_build_info{version, git_commit, cuda} = 1.

 private:
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Histogram* batch_size_ = nullptr;  // engine series: null for SeriesSet::kCoordinator
  prometheus::Gauge* engine_heartbeat_ = nullptr;  // engine series
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  std::array<prometheus::Counter*, 4> finished_;  // stop, length, abort, error
  std::array<prometheus::Counter*, kNumPhases> phase_seconds_ = {};
  prometheus::Gauge* attention_share_ = nullptr;
  prometheus::Gauge* load_seconds_ = nullptr;
  prometheus::Gauge* load_bytes_ = nullptr;
  prometheus::Gauge* load_bytes_per_second_ = nullptr;
  prometheus::Gauge* capture_seconds_ = nullptr;
  prometheus::Gauge* startup_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* capture_bucket_seconds_ = nullptr;
  prometheus::Family<prometheus::Gauge>* startup_memory_ = nullptr;
  prometheus::Labels base_;

  mutable absl::Mutex share_mu_;
  std::array<double, kNumPhases> decayed_ ABSL_GUARDED_BY(share_mu_) = {};
  int64_t last_decay_ns_ ABSL_GUARDED_BY(share_mu_) = 0;
};

}  // namespace dsv4::metrics
