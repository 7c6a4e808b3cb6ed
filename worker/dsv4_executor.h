// ModelExecutor over dsv4::model::Dsv4Model: owns the compute backend (kernels/backend.h), the model, the
// adapters the model calls out through (model_hooks.h; nccl_collectives.h on a GPU group), the phase timer of its
// steps (CUDA events on the backend's stream, or the CPU clock) and, on a device backend, the CUDA graphs of
// decode steps (graph_runner.h): a decode-only step of a captured bucket replays its graph unless the phase timer
// measures that step, which then runs the same padded plan eagerly so its phases can be timed.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "metrics/phase_timer.h"
#include "worker/model_executor.h"
#include "worker/options.h"

namespace dsv4::comm {
class Communicator;
}

namespace dsv4::worker {

struct Dsv4ExecutorOptions {
  std::string checkpoint;
  std::string mode = "exact";   // exact | production
  std::string backend = "cpu";  // cpu | cuda (kernels/backend_factory.h)
  int device = 0;               // CUDA device ordinal
  std::string attention_kernel = "mma";  // CUDA sparse-MLA decode kernel, mma | simt
  int threads = 0;              // CPU backend threads; 0 = all cores
  std::string weight_load = "auto";  // auto | mapped | streamed (model/dsv4/weights.h)
  bool fuse_projections = true;      // ModelOptions::fuse_projections
  int64_t max_step_tokens = 2048;  // the largest step the engine runs (prefill chunk + decode tokens)
  int64_t max_context = 8192;      // the longest sequence (positions)
  // Decode time by phase: the executor makes its timer (on the backend's stream for CUDA) feeding this sink,
  // measuring 1 step in phase_timing_every (phase_timer()); empty sink = no timing.
  metrics::PhaseSink phase_sink = nullptr;
  int phase_timing_every = 64;
  std::function<void(int layers_loaded, int layers_total)> on_layer_loaded = nullptr;  // load progress; may be empty
  // Tensor parallelism (docs/tensor-parallel.md): the group's data communicator. The model then loads only
  // this rank's shard and all-reduces / gathers inside its forward. Null: the whole model (world 1).
  comm::Communicator* tp_comm = nullptr;
};

// The executor options every rank of a worker derives from its flags (the leader adds metrics, progress and its
// group).
Dsv4ExecutorOptions ExecutorOptions(const WorkerOptions& o);

// Loads the checkpoint (this rank's shard with tp_comm); errors name the tensor or field that failed.
absl::StatusOr<std::unique_ptr<ModelExecutor>> LoadDsv4Executor(const Dsv4ExecutorOptions& options);

}  // namespace dsv4::worker
