// ModelExecutor over dsv4::model::Dsv4Model: owns the compute backend (kernels/backend.h), the model and the
// adapters the model calls out through (model_hooks.h).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model_executor.h"

namespace dsv4::comm {
class Communicator;
}
namespace dsv4::metrics {
class PhaseTimer;
}

namespace dsv4::worker {

struct Dsv4ExecutorOptions {
  std::string checkpoint;
  std::string mode = "exact";   // exact | production
  std::string backend = "cpu";  // cpu | cuda (kernels/backend_factory.h)
  int device = 0;               // CUDA device ordinal
  int threads = 0;              // CPU backend threads; 0 = all cores
  int64_t max_step_tokens = 2048;  // the largest step the engine runs (prefill chunk + decode tokens)
  int64_t max_context = 8192;      // the longest sequence (positions)
  metrics::PhaseTimer* phase_timer = nullptr;  // the forward marks its phases on it; null = no timing
  std::function<void(int layers_loaded, int layers_total)> on_layer_loaded = nullptr;  // load progress; may be empty
  // Tensor parallelism (docs/tensor-parallel.md): the group's data communicator. The model then loads only
  // this rank's shard and all-reduces / gathers inside its forward. Null: the whole model (world 1).
  comm::Communicator* tp_comm = nullptr;
};

// Loads the checkpoint (this rank's shard with tp_comm); errors name the tensor or field that failed.
absl::StatusOr<std::unique_ptr<ModelExecutor>> LoadDsv4Executor(const Dsv4ExecutorOptions& options);

}  // namespace dsv4::worker
