// Timing one case under CUDA-graph replay (or eagerly on the CPU backend): see runner.h.
#include "bench/ops/runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_backend.h"

namespace dsv4::bench {
namespace {

using kernels::cuda::CudaBackend;

// Two CUDA events, destroyed with the object.
class EventPair {
 public:
  EventPair() {
    ok_ = cudaEventCreate(&start_) == cudaSuccess && cudaEventCreate(&stop_) == cudaSuccess;
  }
  ~EventPair() {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  absl::Status Check() const { return ok_ ? absl::OkStatus() : absl::InternalError("cudaEventCreate failed"); }
  cudaEvent_t start() const { return start_; }
  cudaEvent_t stop() const { return stop_; }
  // Seconds between the two recorded events (waits for the second).
  absl::StatusOr<double> Seconds() const {
    DSV4_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
    float ms = 0;
    DSV4_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
  bool ok_ = false;
};

double HostSeconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The graph of `sets` calls, captured on the backend's stream and instantiated.
absl::StatusOr<cudaGraphExec_t> Capture(CudaBackend& cuda, const Case& c, int sets) {
  cudaGraph_t graph = nullptr;
  DSV4_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(cuda.stream(), cudaStreamCaptureModeThreadLocal));
  for (int s = 0; s < sets; ++s) c.enqueue(s);
  const cudaError_t end = cudaStreamEndCapture(cuda.stream(), &graph);
  // A launcher that refused its arguments launched nothing; its error surfaces here.
  const absl::Status ops = cuda.Synchronize();
  if (end != cudaSuccess || !ops.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return ops.ok() ? CudaStatus(end, "cudaStreamEndCapture (an op is not capturable)") : ops;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  DSV4_RETURN_IF_ERROR(CudaStatus(inst, "cudaGraphInstantiate"));
  return exec;
}

}  // namespace

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(std::lround(q * static_cast<double>(v.size() - 1)));
  return v[std::min(i, v.size() - 1)];
}

absl::StatusOr<std::vector<double>> Runner::TimeCalls(kernels::Backend& backend, const Case& c, int* sets_out,
                                                      absl::Status* capture_error) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (c.prepare) DSV4_RETURN_IF_ERROR(c.prepare());
  // Eager warm-up of set 0: first-use set-up (function attributes, lazy module loading) happens outside capture.
  c.enqueue(0);
  DSV4_RETURN_IF_ERROR(backend.Synchronize());

  // One more eager call, timed, to size the number of sets one replay may hold.
  double once = 0;
  if (cuda != nullptr) {
    EventPair ev;
    DSV4_RETURN_IF_ERROR(ev.Check());
    DSV4_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start(), cuda->stream()));
    c.enqueue(0);
    DSV4_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.stop(), cuda->stream()));
    DSV4_ASSIGN_OR_RETURN(once, ev.Seconds());
  } else {
    const auto t0 = std::chrono::steady_clock::now();
    c.enqueue(0);
    DSV4_RETURN_IF_ERROR(backend.Synchronize());
    once = HostSeconds(t0);
  }
  DSV4_RETURN_IF_ERROR(backend.Synchronize());
  int sets = std::max(1, c.max_sets);
  if (options_.smoke) {
    sets = 1;
  } else if (once > 0) {
    sets = static_cast<int>(std::clamp<double>(std::floor(options_.replay_budget_s / once), 1.0, sets));
  }
  *sets_out = sets;
  const int reps = options_.smoke ? 1 : std::max(1, options_.reps);
  const int warmup = options_.smoke ? 0 : options_.warmup;
  std::vector<double> per_call;
  per_call.reserve(static_cast<size_t>(reps));

  if (cuda == nullptr) {  // host backend: eager calls, host time
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int s = 0; s < sets; ++s) c.enqueue(s);
      DSV4_RETURN_IF_ERROR(backend.Synchronize());
      per_call.push_back(HostSeconds(t0) / sets);
    }
    return per_call;
  }

  absl::StatusOr<cudaGraphExec_t> captured = Capture(*cuda, c, sets);
  if (!captured.ok()) {
    // Not capturable: time the same calls eagerly so the row still has numbers, and fail the case.
    *capture_error = captured.status();
    EventPair ev;
    DSV4_RETURN_IF_ERROR(ev.Check());
    for (int r = 0; r < reps; ++r) {
      DSV4_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start(), cuda->stream()));
      for (int s = 0; s < sets; ++s) c.enqueue(s);
      DSV4_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.stop(), cuda->stream()));
      DSV4_ASSIGN_OR_RETURN(const double sec, ev.Seconds());
      per_call.push_back(sec / sets);
    }
    DSV4_RETURN_IF_ERROR(backend.Synchronize());
    return per_call;
  }
  const cudaGraphExec_t exec = *captured;
  absl::Status status = absl::OkStatus();
  {
    EventPair ev;
    status = ev.Check();
    // At least `warmup` replays and warmup_s of them: the clocks come up after the host-side set-up of the case.
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; status.ok() && i < 10000 && (i < warmup || (warmup > 0 && HostSeconds(t0) < options_.warmup_s));
         ++i) {
      status = CudaStatus(cudaGraphLaunch(exec, cuda->stream()), "cudaGraphLaunch");
      if (status.ok()) status = CudaStatus(cudaStreamSynchronize(cuda->stream()), "warm-up replay");
    }
    for (int r = 0; status.ok() && r < reps; ++r) {
      status = CudaStatus(cudaEventRecord(ev.start(), cuda->stream()), "cudaEventRecord");
      if (status.ok()) status = CudaStatus(cudaGraphLaunch(exec, cuda->stream()), "cudaGraphLaunch");
      if (status.ok()) status = CudaStatus(cudaEventRecord(ev.stop(), cuda->stream()), "cudaEventRecord");
      if (!status.ok()) break;
      absl::StatusOr<double> s = ev.Seconds();
      if (!s.ok()) {
        status = s.status();
        break;
      }
      per_call.push_back(*s / sets);
    }
  }
  const absl::Status sync = backend.Synchronize();
  cudaGraphExecDestroy(exec);
  DSV4_RETURN_IF_ERROR(status);
  DSV4_RETURN_IF_ERROR(sync);
  return per_call;
}

Result Runner::Run(kernels::Backend& backend, const Case& c) {
  Result r{.family = c.family, .op = c.op, .shape = c.shape, .note = c.note, .params = c.params};
  int sets = 0;
  absl::Status capture_error;
  absl::StatusOr<std::vector<double>> t = TimeCalls(backend, c, &sets, &capture_error);
  if (!t.ok()) {
    r.error = t.status().ToString();
    // Leave the backend usable for the next case (the first error is reported once).
    (void)backend.Synchronize();
    return r;
  }
  r.sets = sets;
  r.rotated_mb = sets * c.rotated_bytes_per_set / 1e6;
  r.median_us = Quantile(*t, 0.5) * 1e6;
  r.p10_us = Quantile(*t, 0.1) * 1e6;
  r.p90_us = Quantile(*t, 0.9) * 1e6;
  if (c.rotated_bytes_per_set > 0 && sets * c.rotated_bytes_per_set < l2_bytes_) {
    r.note = r.note.empty() ? "rotation < L2" : r.note + "; rotation < L2";
  }
  r.bytes = c.bytes ? c.bytes(sets) : 0;
  if (r.median_us > 0) {
    const double bytes_per_s = r.bytes / (r.median_us * 1e-6);
    r.gbs = bytes_per_s / 1e9;
    r.pct_copy = copy_bytes_per_s_ > 0 ? 100.0 * bytes_per_s / copy_bytes_per_s_ : 0;
  }
  absl::Status check = c.check ? c.check() : absl::OkStatus();
  if (check.ok()) check = backend.Synchronize();
  if (check.ok() && !capture_error.ok()) {
    check = absl::FailedPreconditionError(absl::StrCat("timed eagerly, capture failed: ", capture_error.ToString()));
  }
  r.ok = check.ok();
  if (!check.ok()) r.error = check.ToString();
  return r;
}

absl::StatusOr<double> MeasureCopyBandwidth(kernels::Backend& backend, int64_t bytes) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) bytes = std::min<int64_t>(bytes, int64_t{256} << 20);
  DSV4_ASSIGN_OR_RETURN(kernels::Buffer src, backend.Allocate(bytes, kernels::MemoryKind::kWorkspace));
  DSV4_ASSIGN_OR_RETURN(kernels::Buffer dst, backend.Allocate(bytes, kernels::MemoryKind::kWorkspace));
  DSV4_RETURN_IF_ERROR(backend.Synchronize());
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    double s = 0;
    if (cuda != nullptr) {
      EventPair ev;
      DSV4_RETURN_IF_ERROR(ev.Check());
      DSV4_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.start(), cuda->stream()));
      DSV4_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst.data(), src.data(), static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, cuda->stream()));
      DSV4_CUDA_RETURN_IF_ERROR(cudaEventRecord(ev.stop(), cuda->stream()));
      DSV4_ASSIGN_OR_RETURN(s, ev.Seconds());
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), static_cast<size_t>(bytes));
      s = HostSeconds(t0);
    }
    if (i >= 3) t.push_back(s);
  }
  DSV4_RETURN_IF_ERROR(backend.Synchronize());
  return 2.0 * static_cast<double>(bytes) / Quantile(t, 0.5);
}

DeviceInfo GetDeviceInfo(kernels::Backend& backend) {
  DeviceInfo info{.name = backend.name()};
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return info;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, cuda->device()) == cudaSuccess) {
    info.name = absl::StrCat(prop.name, " (sm_", prop.major, prop.minor, ", ", prop.multiProcessorCount, " SMs)");
    info.l2_bytes = prop.l2CacheSize;
    info.sms = prop.multiProcessorCount;
  }
  return info;
}

}  // namespace dsv4::bench
