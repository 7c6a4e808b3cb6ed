// See dsv4_executor.h.
#include "worker/dsv4_executor.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "comm/rendezvous.h"
#include "common/status_macros.h"
#include "kernels/backend_factory.h"
#include "kernels/device_control.h"
#include "model/dsv4/model.h"
#include "worker/graph_runner.h"
#include "worker/model_hooks.h"
#if defined(DSV4_HAVE_NCCL)
#include "comm/nccl_communicator.h"
#include "worker/nccl_collectives.h"
#endif

namespace dsv4::worker {
namespace {

bool DecodeOnly(std::span<const SeqChunk> chunks) {
  return std::all_of(chunks.begin(), chunks.end(), [](const SeqChunk& c) { return c.tokens.size() == 1; });
}

class Dsv4Executor final : public ModelExecutor {
 public:
  Dsv4Executor(std::unique_ptr<kernels::Backend> backend, std::unique_ptr<model::Collectives> collectives,
               std::unique_ptr<metrics::PhaseTimer> timer)
      : backend_(std::move(backend)), collectives_(std::move(collectives)), timer_(std::move(timer)) {
    if (timer_ != nullptr) phase_hook_ = std::make_unique<PhaseTimerHook>(timer_.get());
#if defined(DSV4_HAVE_NCCL)
    nccl_ = dynamic_cast<NcclCollectives*>(collectives_.get());
#endif
  }

  absl::Status Load(const Dsv4ExecutorOptions& o) {
    model::ModelOptions mo;
    mo.mode = o.mode == "production" ? model::NumericMode::kProduction : model::NumericMode::kExact;
    mo.backend = backend_.get();
    if (collectives_ != nullptr) mo.shard = {collectives_->rank(), collectives_->world()};
    mo.collectives = collectives_.get();
    mo.phase_hook = phase_hook_.get();
    mo.max_step_tokens = o.max_step_tokens;
    mo.max_context = o.max_context;
    mo.on_layer_loaded = o.on_layer_loaded;
    mo.fuse_projections = o.fuse_projections;
    DSV4_ASSIGN_OR_RETURN(mo.weight_load.mode, model::ParseWeightLoadMode(o.weight_load));
    DSV4_ASSIGN_OR_RETURN(model_, model::Dsv4Model::Load(o.checkpoint, mo));
    const Config& c = model_->config();
    info_.model_name = std::filesystem::path(o.checkpoint).lexically_normal().filename().string();
    if (info_.model_name.empty()) info_.model_name = std::filesystem::path(o.checkpoint).parent_path().filename();
    info_.weight_format = c.hf_quant.has_value() ? "nvfp4-experts+fp8" : "mxfp4-experts+fp8";
    info_.vocab_size = static_cast<int>(c.vocab_size);
    for (int64_t id : c.eos_token_ids) info_.eos_token_ids.push_back(static_cast<int32_t>(id));
    info_.bos_token_id = static_cast<int>(c.bos_token_id);
    info_.num_layers = static_cast<int>(c.num_hidden_layers);
    DSV4_ASSIGN_OR_RETURN(info_.checkpoint_fingerprint, comm::CheckpointFingerprint(o.checkpoint));
    return absl::OkStatus();
  }

  const ModelInfo& info() const override { return info_; }
  int64_t PageBytes(Pool pool, int page_rows) const override { return model_->PageBytes(pool, page_rows); }
  int64_t RowsNeeded(Pool pool, int64_t num_positions) const override {
    return model::Dsv4Model::RowsNeeded(model_->config(), pool, num_positions);
  }
  absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages, int page_rows, int slots) override {
    // Graphs point at the memory about to be replaced: free them first (the buckets stay; CaptureGraphs again).
    if (runner_ != nullptr) runner_->InvalidateAll();
    DSV4_RETURN_IF_ERROR(model_->AllocateCache(pages, page_rows, slots));
#if defined(DSV4_HAVE_NCCL)
    if (nccl_ != nullptr) DSV4_RETURN_IF_ERROR(nccl_->Reserve(model_->max_head_rows()));
#endif
    return absl::OkStatus();
  }
  absl::Status ResetState(int32_t slot) override { return model_->ResetState(slot); }

  absl::Status Forward(std::span<const SeqChunk> chunks, float* logits) override {
    if (runner_ != nullptr && DecodeOnly(chunks) && runner_->BucketFor(static_cast<int64_t>(chunks.size())) > 0) {
      // A step the phase timer measures runs eagerly (its phases are host-marked); it is padded like the graph.
      const bool timed = timer_ != nullptr && timer_->sampling();
      return runner_->RunDecode(chunks, logits, timed);
    }
    return model_->Forward(chunks, logits);
  }

  bool SamplesInStep() const override { return true; }
  bool StepLogitsAvailable() const override { return true; }
  absl::Status CopyStepLogits(std::span<const int> rows, float* out) override {
    return model_->CopyLogitRows(rows, out);
  }
  absl::Status ForwardSample(std::span<const SeqChunk> chunks, std::span<const kernels::SampleParams> sampling,
                             int32_t* tokens) override {
    if (runner_ != nullptr && DecodeOnly(chunks) && runner_->BucketFor(static_cast<int64_t>(chunks.size())) > 0) {
      const bool timed = timer_ != nullptr && timer_->sampling();
      return runner_->RunDecodeSample(chunks, sampling, tokens, timed);
    }
    if (chunks.empty()) return absl::InvalidArgumentError("Forward with no chunks");
    const model::StepShape shape = model::Dsv4Model::ShapeOf(chunks);
    DSV4_RETURN_IF_ERROR(model_->PrepareStep(chunks, shape, sampling));
    DSV4_RETURN_IF_ERROR(model_->EnqueueStep(shape, /*sample=*/true));
    return model_->FinishStepTokens(tokens, static_cast<int64_t>(chunks.size()));
  }

  ExecutorMemory Memory() override {
    const auto held = backend_->allocated();
    ExecutorMemory m{.backend = backend_->name(),
                     .weights = held[static_cast<int>(kernels::MemoryKind::kWeights)],
                     .kv_cache = held[static_cast<int>(kernels::MemoryKind::kKvCache)],
                     .state = held[static_cast<int>(kernels::MemoryKind::kState)],
                     .workspace = held[static_cast<int>(kernels::MemoryKind::kWorkspace)],
                     .host_staging = held[static_cast<int>(kernels::MemoryKind::kHostStaging)]};
    if (kernels::DeviceControl* device = backend_->device_control(); device != nullptr) {
      if (absl::StatusOr<kernels::DeviceMemory> d = device->Memory(); d.ok()) {
        m.device = true;
        m.device_total = d->total;
        m.device_free = d->free;
      }
    }
    return m;
  }

  absl::StatusOr<GraphCaptureReport> CaptureGraphs(const std::vector<int>& buckets, bool capture) override {
    if (buckets.empty()) {
      runner_.reset();
      return GraphCaptureReport{};
    }
    kernels::DeviceControl* device = capture ? backend_->device_control() : nullptr;  // null: padded, eager
    if (runner_ == nullptr || runner_->buckets() != buckets || runner_->device() != device) {
      runner_ = std::make_unique<GraphRunner>(*model_, device, buckets);
    }
    return runner_->CaptureAll();
  }

  metrics::PhaseTimer* phase_timer() override { return timer_.get(); }

 private:
  // Declaration order is destruction order in reverse: graphs, then the model, before the backend and adapters.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Collectives> collectives_;
#if defined(DSV4_HAVE_NCCL)
  NcclCollectives* nccl_ = nullptr;  // collectives_ when it is the NCCL one (its buffers follow AllocateCache)
#endif
  std::unique_ptr<metrics::PhaseTimer> timer_;
  std::unique_ptr<PhaseTimerHook> phase_hook_;
  std::unique_ptr<model::Dsv4Model> model_;
  std::unique_ptr<GraphRunner> runner_;
  ModelInfo info_;
};

// The collectives of a tensor-parallel rank: NCCL on the backend's stream for a GPU group, the communicator's own
// (Gloo) otherwise.
absl::StatusOr<std::unique_ptr<model::Collectives>> MakeCollectives(comm::Communicator* comm, kernels::Backend& backend,
                                                                    const model::ShardLayout& layout) {
  if (comm->backend() == "nccl") {
#if defined(DSV4_HAVE_NCCL)
    auto* nc = dynamic_cast<comm::NcclCommunicator*>(comm);
    if (nc == nullptr) return absl::InternalError("a communicator named nccl is not a NcclCommunicator");
    DSV4_ASSIGN_OR_RETURN(std::unique_ptr<NcclCollectives> c, NcclCollectives::Create(nc, &backend, layout));
    return std::unique_ptr<model::Collectives>(std::move(c));
#else
    return absl::FailedPreconditionError("an NCCL group in a build without NCCL");
#endif
  }
  if (backend.device_control() != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("backend ", backend.name(), " keeps activations in device ",
                                                      "memory: its group needs NCCL collectives, but the group's ",
                                                      "communicator is ", std::string(comm->backend())));
  }
  return std::unique_ptr<model::Collectives>(std::make_unique<CommCollectives>(comm, layout));
}

// The phase timer of the backend's steps: CUDA events on its stream, or the CPU clock.
absl::StatusOr<std::unique_ptr<metrics::PhaseTimer>> MakePhaseTimer(const Dsv4ExecutorOptions& o,
                                                                    kernels::Backend& backend) {
  if (!o.phase_sink) return std::unique_ptr<metrics::PhaseTimer>();
  const metrics::PhaseTimerOptions options{.sample_every = o.phase_timing_every};
  if (kernels::DeviceControl* device = backend.device_control(); device != nullptr) {
#if defined(DSV4_HAVE_CUDA)
    DSV4_ASSIGN_OR_RETURN(std::unique_ptr<metrics::CudaPhaseTimer> timer,
                          metrics::MakeCudaPhaseTimer(o.phase_sink, static_cast<cudaStream_t>(device->stream()),
                                                      options));
    DSV4_LOG_INFO("phase timing: CUDA events on the backend's stream, 1 decode step in {}", options.sample_every);
    return std::unique_ptr<metrics::PhaseTimer>(std::move(timer));
#else
    return absl::FailedPreconditionError("a device backend in a build without CUDA");
#endif
  }
  DSV4_LOG_INFO("phase timing: monotonic clock on the CPU, 1 decode step in {}", options.sample_every);
  return metrics::MakeCpuPhaseTimer(o.phase_sink, options);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelExecutor>> LoadDsv4Executor(const Dsv4ExecutorOptions& o) {
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                        kernels::MakeBackend({.name = o.backend, .threads = o.threads, .device = o.device,
                                              .attention_kernel = o.attention_kernel}));
  std::unique_ptr<model::Collectives> collectives;
  if (o.tp_comm != nullptr && o.tp_comm->world() > 1) {
    DSV4_ASSIGN_OR_RETURN(Config c, LoadConfig(o.checkpoint));
    DSV4_ASSIGN_OR_RETURN(model::ShardLayout layout,
                          model::PlanShardLayout(c, {o.tp_comm->rank(), o.tp_comm->world()}));
    DSV4_ASSIGN_OR_RETURN(collectives, MakeCollectives(o.tp_comm, *backend, layout));
  }
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<metrics::PhaseTimer> timer, MakePhaseTimer(o, *backend));
  auto ex = std::make_unique<Dsv4Executor>(std::move(backend), std::move(collectives), std::move(timer));
  DSV4_RETURN_IF_ERROR(ex->Load(o));
  return std::unique_ptr<ModelExecutor>(std::move(ex));
}

Dsv4ExecutorOptions ExecutorOptions(const WorkerOptions& o) {
  return {.checkpoint = o.checkpoint, .mode = o.mode, .backend = o.backend, .device = o.device,
          .attention_kernel = o.attention_kernel, .threads = o.threads, .weight_load = o.weight_load,
          .fuse_projections = o.fuse_projections, .max_step_tokens = MaxStepTokens(o), .max_context = o.max_context};
}

}  // namespace dsv4::worker
