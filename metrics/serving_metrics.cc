// Implementation of metrics/serving_metrics.h: the /metrics endpoint and the serving series.
#include "metrics/serving_metrics.h"

#include <chrono>
#include <cmath>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"

#ifndef DSV4_VERSION
#define DSV4_VERSION "unknown"
#endif
#ifndef DSV4_GIT_COMMIT
#define DSV4_GIT_COMMIT "unknown"
#endif

namespace dsv4::metrics {
namespace {

// Time constant of the decayed sums behind dsv4_attention_time_share: long enough to average many steps,
// short enough that the gauge shows a change of mix within a minute or two.
constexpr double kShareTauSeconds = 60.0;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The base labels {role, group, rank} plus any extra pairs.
prometheus::Labels BaseLabels(const Labels& l) {
  return {{"role", l.role}, {"group", std::to_string(l.group)}, {"rank", std::to_string(l.rank)}};
}

prometheus::Labels With(prometheus::Labels base, const std::string& key, std::string value) {
  base.emplace(key, std::move(value));
  return base;
}

prometheus::Gauge* MakeGauge(prometheus::Registry& r, const std::string& name, const std::string& help,
                             const prometheus::Labels& labels) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Counter* MakeCounter(prometheus::Registry& r, const std::string& name, const std::string& help,
                                 const prometheus::Labels& labels) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Histogram* MakeHistogram(prometheus::Registry& r, const std::string& name, const std::string& help,
                                     const prometheus::Labels& labels, const std::vector<double>& buckets) {
  return &prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add(labels, buckets);
}

}  // namespace

std::string_view PhaseName(Phase p) {
  switch (p) {
    case Phase::kAttention:
      return "attention";
    case Phase::kMoe:
      return "moe";
    case Phase::kDense:
      return "dense";
    case Phase::kComm:
      return "comm";
    case Phase::kOther:
      return "other";
  }
  return "other";
}

// Buckets: about three per decade, denser where the serving targets sit (TTFT 0.1-2 s, ITL 10-100 ms).
const std::vector<double>& TtftBuckets() {
  static const std::vector<double> b = {0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                        1.5,   2.0,  2.5,  5.0,  7.5,  10.0, 15.0, 20.0, 30.0, 45.0, 60.0};
  return b;
}
const std::vector<double>& ItlBuckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                                        0.06,  0.075,  0.1,   0.15,   0.2,  0.3,   0.4,  0.5,   0.75, 1.0,  2.0};
  return b;
}
const std::vector<double>& E2eBuckets() {
  static const std::vector<double> b = {0.01, 0.025, 0.05, 0.1,  0.25,  0.5,   1.0,   2.5,  5.0,
                                        10.0, 20.0,  30.0, 60.0, 120.0, 240.0, 480.0, 600.0};
  return b;
}
const std::vector<double>& BatchSizeBuckets() {
  static const std::vector<double> b = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024};
  return b;
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& listen_addr) {
  // Validate "host:port" here: civetweb's own error for a malformed address is an opaque exception.
  const size_t colon = listen_addr.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(listen_addr.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen must be host:port with port 0..65535, got \"", listen_addr, "\""));
  }
  // civetweb binds without SO_REUSEPORT, so a port another process listens on fails here (the constructor
  // throws) instead of being shared; a bound port other than the one asked for is refused too.
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(listen_addr, /*num_threads=*/2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics-listen ", listen_addr, ": cannot listen on port ", port,
                                               port > 0 ? " (already in use by another process?)" : "", ": ",
                                               e.what()));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty() || ports[0] <= 0) {
    return absl::InternalError(absl::StrCat("metrics server on ", listen_addr, " reports no listening port"));
  }
  if (port > 0 && ports[0] != port) {
    return absl::UnavailableError(absl::StrCat("--metrics-listen ", listen_addr, ": asked for port ", port,
                                               " but the server bound port ", ports[0]));
  }
  auto registry = std::make_shared<prometheus::Registry>();
  exposer->RegisterCollectable(registry);
  DSV4_LOG_INFO("metrics: serving /metrics on {} (port {})", listen_addr, ports[0]);
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(exposer), std::move(registry), ports[0]));
}

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer,
                             std::shared_ptr<prometheus::Registry> registry, int port)
    : exposer_(std::move(exposer)), registry_(std::move(registry)), port_(port) {}

MetricsServer::~MetricsServer() = default;

ServingMetrics::ServingMetrics(prometheus::Registry& r, const Labels& labels, SeriesSet series) {
  const prometheus::Labels base = BaseLabels(labels);
  running_ = MakeGauge(r, "dsv4_num_requests_running", "Requests in the decode batch.", base);
  waiting_ = MakeGauge(r, "dsv4_num_requests_waiting", "Requests queued, not yet admitted.", base);
  kv_usage_ = MakeGauge(r, "dsv4_kv_cache_usage_ratio", "Fraction of KV cache blocks in use (0..1).", base);
  prompt_tokens_ = MakeCounter(r, "dsv4_prompt_tokens_total", "Prompt tokens prefilled.", base);
  generation_tokens_ = MakeCounter(r, "dsv4_generation_tokens_total", "Tokens generated.", base);
  ttft_ = MakeHistogram(r, "dsv4_time_to_first_token_seconds", "Time to first token.", base, TtftBuckets());
  itl_ = MakeHistogram(r, "dsv4_inter_token_latency_seconds", "Time between tokens.", base, ItlBuckets());
  e2e_ = MakeHistogram(r, "dsv4_e2e_request_latency_seconds", "Request latency, arrival to finish.", base,
                       E2eBuckets());
  auto& finished = prometheus::BuildCounter()
                       .Name("dsv4_request_finished_total")
                       .Help("Finished requests by reason.")
                       .Register(r);
  const char* reasons[] = {"stop", "length", "abort", "error"};
  for (size_t i = 0; i < finished_.size(); ++i) finished_[i] = &finished.Add(With(base, "reason", reasons[i]));
#if defined(DSV4_HAVE_CUDA)
  const char* cuda = "yes";
#else
  const char* cuda = "no";
#endif
  prometheus::Labels build = base;
  build.insert({{"version", DSV4_VERSION}, {"git_commit", DSV4_GIT_COMMIT}, {"cuda", cuda}});
  MakeGauge(r, "dsv4_build_info", "Build of this process (value 1).", build)->Set(1);
  last_decay_ns_ = NowNs();
  if (series == SeriesSet::kCoordinator) return;  // no engine: the series below would stay 0

  batch_size_ = MakeHistogram(r, "dsv4_decode_batch_size", "Sequences per decode step.", base, BatchSizeBuckets());
  engine_heartbeat_ = MakeGauge(r, "dsv4_engine_seconds_since_progress",
                                "Seconds since the engine last finished a step while it has work (0 idle).", base);
  auto& phases = prometheus::BuildCounter()
                     .Name("dsv4_decode_gpu_seconds_total")
                     .Help("Decode time by phase (CUDA events on sampled steps; monotonic clock on CPU).")
                     .Register(r);
  for (int i = 0; i < kNumPhases; ++i) {
    phase_seconds_[i] = &phases.Add(With(base, "phase", std::string(PhaseName(static_cast<Phase>(i)))));
  }
  attention_share_ = MakeGauge(r, "dsv4_attention_time_share",
                               "Attention share of decode time, decayed over about 60 s.", base);
  load_seconds_ = MakeGauge(r, "dsv4_startup_weight_load_seconds", "Weight load time at start-up.", base);
  load_bytes_ = MakeGauge(r, "dsv4_startup_weight_load_bytes", "Weight bytes loaded at start-up.", base);
  load_bytes_per_second_ =
      MakeGauge(r, "dsv4_startup_weight_load_bytes_per_second", "Weight load throughput at start-up.", base);
  capture_seconds_ = MakeGauge(r, "dsv4_startup_graph_capture_seconds", "CUDA graph capture time.", base);
  startup_seconds_ = MakeGauge(r, "dsv4_startup_total_seconds", "Process start to ready.", base);
  capture_bucket_seconds_ = &prometheus::BuildGauge()
                                 .Name("dsv4_startup_graph_capture_bucket_seconds")
                                 .Help("CUDA graph of one decode batch bucket: warm-up step and capture.")
                                 .Register(r);
  startup_memory_ = &prometheus::BuildGauge()
                         .Name("dsv4_startup_memory_bytes")
                         .Help("Start-up memory plan by kind (device memory on a GPU worker).")
                         .Register(r);
  base_ = base;
}

void ServingMetrics::SetRunning(int n) { running_->Set(n); }
void ServingMetrics::SetWaiting(int n) { waiting_->Set(n); }
void ServingMetrics::SetKvUsage(double ratio) { kv_usage_->Set(ratio); }
void ServingMetrics::SetEngineHeartbeat(double seconds) {
  if (engine_heartbeat_ != nullptr) engine_heartbeat_->Set(seconds);
}
void ServingMetrics::ObserveBatchSize(int b) {
  if (batch_size_ != nullptr) batch_size_->Observe(b);
}

// prometheus-cpp drops negative increments silently; skip them here too, explicitly, so a caller's
// bug cannot make a counter run backwards.
void ServingMetrics::AddPromptTokens(int64_t n) {
  if (n > 0) prompt_tokens_->Increment(static_cast<double>(n));
}
void ServingMetrics::AddGenerationTokens(int64_t n) {
  if (n > 0) generation_tokens_->Increment(static_cast<double>(n));
}

void ServingMetrics::ObserveTtft(double s) { ttft_->Observe(s); }
void ServingMetrics::ObserveItl(double s) { itl_->Observe(s); }
void ServingMetrics::ObserveE2e(double s) { e2e_->Observe(s); }

void ServingMetrics::RequestFinished(std::string_view reason) {
  size_t i = 3;  // unknown reasons are errors: the label set stays bounded
  if (reason == "stop") i = 0;
  if (reason == "length") i = 1;
  if (reason == "abort") i = 2;
  finished_[i]->Increment();
}

void ServingMetrics::AddPhaseSeconds(Phase p, double s) {
  if (!(s > 0) || !std::isfinite(s)) return;  // NaN, inf and negatives never reach a counter
  const int i = static_cast<int>(p);
  if (i < 0 || i >= kNumPhases || phase_seconds_[i] == nullptr) return;
  phase_seconds_[i]->Increment(s);
  absl::MutexLock lock(&share_mu_);
  const int64_t now = NowNs();
  const double decay = std::exp(-static_cast<double>(now - last_decay_ns_) * 1e-9 / kShareTauSeconds);
  last_decay_ns_ = now;
  double total = 0;
  for (int k = 0; k < kNumPhases; ++k) {
    decayed_[k] *= decay;
    if (k == i) decayed_[k] += s;
    total += decayed_[k];
  }
  attention_share_->Set(total > 0 ? decayed_[static_cast<int>(Phase::kAttention)] / total : 0.0);
}

void ServingMetrics::SetStartup(double load_s, double load_bytes, double capture_s, double total_s) {
  if (load_seconds_ == nullptr) return;
  load_seconds_->Set(load_s);
  load_bytes_->Set(load_bytes);
  load_bytes_per_second_->Set(load_s > 0 ? load_bytes / load_s : 0.0);
  capture_seconds_->Set(capture_s);
  startup_seconds_->Set(total_s);
}

void ServingMetrics::SetGraphCaptureSeconds(int bucket, double s) {
  if (capture_bucket_seconds_ == nullptr) return;
  capture_bucket_seconds_->Add(With(base_, "bucket", std::to_string(bucket))).Set(s);
}

void ServingMetrics::SetStartupMemory(std::string_view kind, double bytes) {
  if (startup_memory_ == nullptr) return;
  startup_memory_->Add(With(base_, "kind", std::string(kind))).Set(bytes);
}

double ServingMetrics::attention_time_share() const {
  return attention_share_ != nullptr ? attention_share_->Value() : 0.0;
}

}  // namespace dsv4::metrics
