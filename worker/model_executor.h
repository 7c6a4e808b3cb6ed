// The engine's only view of a model: the few operations continuous batching needs. One implementation adapts
// dsv4::model::Dsv4Model (dsv4_executor.h); a deterministic fake lives in tests/worker for fast scheduler,
// allocator and sampling tests. Keeping the engine behind this interface is what lets the CUDA backend and
// tensor-parallel groups plug in later without touching the scheduler.
//
// Threads: an executor is used by the engine thread only.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/ops.h"
#include "model/dsv4/step.h"

namespace dsv4::metrics {
class PhaseTimer;
}

namespace dsv4::worker {

// The step types are the model's (model/dsv4/step.h): one definition for the planner and the forward.
using Pool = model::KvPool;
inline constexpr int kNumPools = model::kNumKvPools;
inline constexpr const auto& kPoolNames = model::kKvPoolNames;
using BlockTables = model::SeqBlockTables;
using SeqChunk = model::SeqChunk;

// Bytes the executor's backend holds by kind, and the device's memory when the backend has one (start-up plan).
struct ExecutorMemory {
  std::string backend;          // the backend's name, e.g. "cuda:0 (NVIDIA H200, sm_90), attention mma"
  bool device = false;          // a device backend: device_total / device_free are the GPU's
  int64_t device_total = 0;
  int64_t device_free = 0;      // free on the device now (every process's allocations counted)
  int64_t weights = 0, kv_cache = 0, state = 0, workspace = 0, host_staging = 0;
};

// CUDA graphs captured at start-up (worker/graph_runner.h): time per bucket and what they hold.
struct GraphCaptureReport {
  struct Bucket {
    int bucket = 0;
    double warm_up_seconds = 0;  // the eager all-padding step before the capture
    double capture_seconds = 0;  // capture + instantiate + upload
    int64_t nodes = 0;
  };
  std::vector<Bucket> buckets;  // in capture order (ascending)
  double seconds = 0;           // everything, warm-ups included
  int64_t device_bytes = 0;     // device memory the graphs took (free before minus free after; 0 when unknown)
  std::string ToString() const;
};

struct ModelInfo {
  std::string model_name;
  std::string weight_format;
  int vocab_size = 0;
  std::vector<int32_t> eos_token_ids;  // any of them ends a request unless ignore_eos
  int bos_token_id = -1;
  int num_layers = 0;
  std::string checkpoint_fingerprint;  // comm::CheckpointFingerprint of the loaded folder ("" when not known)
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual const ModelInfo& info() const = 0;
  // Bytes of one page of page_rows rows of `pool`, over all layers; 0 when no layer uses the pool.
  virtual int64_t PageBytes(Pool pool, int page_rows) const = 0;
  // Rows of `pool` a sequence with num_positions cached tokens occupies.
  virtual int64_t RowsNeeded(Pool pool, int64_t num_positions) const = 0;
  virtual absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages_per_pool, int page_rows,
                                     int max_state_slots) = 0;
  virtual absl::Status ResetState(int32_t state_slot) = 0;
  // Runs every chunk and writes the logits of each chunk's last token to logits[i * vocab_size].
  virtual absl::Status Forward(std::span<const SeqChunk> chunks, float* logits) = 0;
  // Whether ForwardSample draws the tokens inside the step (the backend's Sample op, kernels/ops.h): the engine
  // then passes each chunk's sampling parameters and gets token ids back; no logits leave the backend.
  virtual bool SamplesInStep() const { return false; }
  // Runs every chunk like Forward and draws a token from each chunk's last-token logits with sampling[i]
  // (temperature < 0: no draw, tokens[i] = -1) into tokens[i]. The token is the one worker/sampler.h would draw.
  virtual absl::Status ForwardSample(std::span<const SeqChunk> chunks, std::span<const kernels::SampleParams> sampling,
                                     int32_t* tokens) {
    return absl::UnimplementedError("this executor does not sample inside the step");
  }
  // After ForwardSample: copies the raw last-token logits of chunks `rows` (indices into that step's chunks) to
  // out[j * vocab_size] - for the requests that asked for log-probabilities, so only their rows leave the device
  // and every token stays the one drawn in the step. StepLogitsAvailable says whether this executor can.
  virtual bool StepLogitsAvailable() const { return false; }
  virtual absl::Status CopyStepLogits(std::span<const int> rows, float* out) {
    return absl::UnimplementedError("this executor cannot copy a sampled step's logits");
  }

  // What the backend holds (and the device's memory); the default reports nothing (a fake executor).
  virtual ExecutorMemory Memory() { return {}; }
  // After AllocateCache: decode buckets (ascending). From then on a decode-only step of n <= the largest bucket
  // sequences is padded to the smallest bucket >= n - on every rank of a group alike - and, with `capture`, replays
  // that bucket's CUDA graph, captured now; without (--cuda-graphs=false), or on a backend without graphs, the
  // padded step runs eagerly. Empty buckets: no padding.
  virtual absl::StatusOr<GraphCaptureReport> CaptureGraphs(const std::vector<int>& buckets, bool capture = true) {
    return GraphCaptureReport{};
  }
  // The timer the engine brackets each step with (BeginStep / EndStep; the forward marks the phases inside),
  // measuring on the executor's own clock or stream; null = no phase timing.
  virtual metrics::PhaseTimer* phase_timer() { return nullptr; }
};

}  // namespace dsv4::worker
