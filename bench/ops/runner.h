// How dsv4-ops-bench times one op at one shape (a "case"), and what it records.
//
// A case enqueues its op once per input set (set = a copy of the data the op streams from memory: weights, KV
// rows, compressor state). On the CUDA backend the runner
//   1. runs set 0 eagerly (warm-up, first-use set-up outside any capture) and checks the backend's status,
//   2. times one more eager call of set 0 and caps the sets so that one replay stays near the time budget,
//   3. captures one CUDA graph holding one call per set on the backend's stream (as the engine captures a step),
//   4. replays it `warmup` times (and for at least warmup_s), then `reps` times with CUDA events around each,
//   5. reports per call: the median, 10th and 90th percentile of replay time / sets,
//   6. runs the case's check (outputs finite, counts in range) on what the replays left.
// A case whose calls cannot be captured is timed eagerly instead (event pairs around the same calls) and marked
// failed, so the table still shows a number and says why.
// The sets cycle through more memory than the L2 (--rotate_mb), so the streamed data comes from HBM as in a
// real step, where each layer's weights and KV rows are read once. On the CPU backend (a harness check on a
// machine without a GPU) the calls run eagerly and host time is taken.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "nlohmann/json.hpp"

namespace dsv4::bench {

struct RunOptions {
  int reps = 50;                  // timed replays (median reported)
  int warmup = 3;                 // untimed replays before them (at least; see warmup_s)
  double warmup_s = 0.02;         // and replays until this much time has passed
  double replay_budget_s = 0.025;  // sets are capped so that one replay takes about this long (eager estimate)
  bool smoke = false;             // one set, one replay, no warm-up
};

// One op at one shape.
struct Case {
  std::string family{};   // linear, moe, indexer, attention, dense, cache
  std::string op{};       // wq_a, moe_nvfp4, attention_mma, rmsnorm, ...
  std::string shape{};    // human-readable shape, e.g. "FP8 [1024, 4096] T=8"
  nlohmann::json params{};  // the same, structured, for the JSON file
  int max_sets = 1;       // input sets prepared (the runner may use fewer, never more)
  double rotated_bytes_per_set = 0;  // bytes of streamed data per set (0: nothing rotated, activations only)
  // Enqueues the op on input set `set` (no host sync, no allocation: it is captured).
  std::function<void(int set)> enqueue{};
  // Bytes the op must move per call (reads + writes of weights, KV, state, activations), averaged over the
  // first `sets` sets.
  std::function<double(int sets)> bytes{};
  // Called once before the eager run (e.g. poison outputs with NaN); may be empty.
  std::function<absl::Status()> prepare{};
  // Checks the outputs after the replays: OK, or an error saying what is wrong. May be empty.
  std::function<absl::Status()> check{};
  std::string note{};  // printed in the table's last column
};

struct Result {
  std::string family{}, op{}, shape{}, note{};
  nlohmann::json params{};
  int sets = 0;
  double rotated_mb = 0;
  double median_us = 0, p10_us = 0, p90_us = 0;
  double bytes = 0, gbs = 0, pct_copy = 0;
  bool ok = false;
  std::string error{};  // why the case failed (empty when ok)
};

class Runner {
 public:
  Runner(RunOptions options, double copy_bytes_per_s, double l2_bytes)
      : options_(options), copy_bytes_per_s_(copy_bytes_per_s), l2_bytes_(l2_bytes) {}

  // Times `c` on `backend` (the backend that owns the case's buffers and weights).
  Result Run(kernels::Backend& backend, const Case& c);
  const RunOptions& options() const { return options_; }
  double l2_bytes() const { return l2_bytes_; }

 private:
  // Per-call seconds of each replay; *sets: the sets used; *capture_error: why the graph could not be captured
  // (the calls were then timed eagerly).
  absl::StatusOr<std::vector<double>> TimeCalls(kernels::Backend& backend, const Case& c, int* sets,
                                                absl::Status* capture_error);
  RunOptions options_;
  double copy_bytes_per_s_;
  double l2_bytes_;
};

// Device-to-device copy bandwidth of `bytes` (read + written bytes per second, median of 10 copies after 3
// warm-ups) on the backend's stream; on the CPU backend, memcpy's.
absl::StatusOr<double> MeasureCopyBandwidth(kernels::Backend& backend, int64_t bytes);

// The device's name and L2 size in bytes ("cpu", 0 without a GPU).
struct DeviceInfo {
  std::string name;
  double l2_bytes = 0;
  int sms = 0;
};
DeviceInfo GetDeviceInfo(kernels::Backend& backend);

// Median and quantiles of a sample (sorted copy).
double Quantile(std::vector<double> v, double q);

}  // namespace dsv4::bench
