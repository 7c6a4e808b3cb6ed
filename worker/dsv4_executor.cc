// See dsv4_executor.h.
#include "worker/dsv4_executor.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/backend_factory.h"
#include "model/dsv4/model.h"
#include "worker/model_hooks.h"

namespace dsv4::worker {
namespace {

class Dsv4Executor final : public ModelExecutor {
 public:
  Dsv4Executor(std::unique_ptr<kernels::Backend> backend, std::unique_ptr<CommCollectives> collectives,
               std::unique_ptr<PhaseTimerHook> phase_hook)
      : backend_(std::move(backend)), collectives_(std::move(collectives)), phase_hook_(std::move(phase_hook)) {}

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
    DSV4_ASSIGN_OR_RETURN(model_, model::Dsv4Model::Load(o.checkpoint, mo));
    const Config& c = model_->config();
    info_.model_name = std::filesystem::path(o.checkpoint).lexically_normal().filename().string();
    if (info_.model_name.empty()) info_.model_name = std::filesystem::path(o.checkpoint).parent_path().filename();
    info_.weight_format = c.hf_quant.has_value() ? "nvfp4-experts+fp8" : "mxfp4-experts+fp8";
    info_.vocab_size = static_cast<int>(c.vocab_size);
    for (int64_t id : c.eos_token_ids) info_.eos_token_ids.push_back(static_cast<int32_t>(id));
    info_.bos_token_id = static_cast<int>(c.bos_token_id);
    info_.num_layers = static_cast<int>(c.num_hidden_layers);
    return absl::OkStatus();
  }

  const ModelInfo& info() const override { return info_; }
  int64_t PageBytes(Pool pool, int page_rows) const override { return model_->PageBytes(pool, page_rows); }
  int64_t RowsNeeded(Pool pool, int64_t num_positions) const override {
    return model::Dsv4Model::RowsNeeded(model_->config(), pool, num_positions);
  }
  absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages, int page_rows, int slots) override {
    return model_->AllocateCache(pages, page_rows, slots);
  }
  absl::Status ResetState(int32_t slot) override { return model_->ResetState(slot); }
  absl::Status Forward(std::span<const SeqChunk> chunks, float* logits) override {
    return model_->Forward(chunks, logits);
  }

 private:
  // Declaration order is destruction order in reverse: the model goes before the backend and the adapters.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<CommCollectives> collectives_;
  std::unique_ptr<PhaseTimerHook> phase_hook_;
  std::unique_ptr<model::Dsv4Model> model_;
  ModelInfo info_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelExecutor>> LoadDsv4Executor(const Dsv4ExecutorOptions& o) {
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend,
                        kernels::MakeBackend({.name = o.backend, .threads = o.threads, .device = o.device}));
  std::unique_ptr<CommCollectives> collectives;
  if (o.tp_comm != nullptr && o.tp_comm->world() > 1) {
    DSV4_ASSIGN_OR_RETURN(Config c, LoadConfig(o.checkpoint));
    DSV4_ASSIGN_OR_RETURN(model::ShardLayout layout,
                          model::PlanShardLayout(c, {o.tp_comm->rank(), o.tp_comm->world()}));
    collectives = std::make_unique<CommCollectives>(o.tp_comm, layout);
  }
  std::unique_ptr<PhaseTimerHook> hook;
  if (o.phase_timer != nullptr) hook = std::make_unique<PhaseTimerHook>(o.phase_timer);
  auto ex = std::make_unique<Dsv4Executor>(std::move(backend), std::move(collectives), std::move(hook));
  DSV4_RETURN_IF_ERROR(ex->Load(o));
  return std::unique_ptr<ModelExecutor>(std::move(ex));
}

}  // namespace dsv4::worker
