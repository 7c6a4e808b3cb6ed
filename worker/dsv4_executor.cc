// See dsv4_executor.h. Translates the worker's block tables into the model's; the copy per step is tiny next to
// a forward pass.
#include "worker/dsv4_executor.h"

#include <filesystem>
#include <thread>
#include <utility>
#include <vector>

#include "common/status_macros.h"
#include "model/dsv4/model.h"

namespace dsv4::worker {
namespace {

class Dsv4Executor final : public ModelExecutor {
 public:
  Dsv4Executor(std::unique_ptr<model::Dsv4Model> model, ModelInfo info)
      : model_(std::move(model)), info_(std::move(info)) {}

  const ModelInfo& info() const override { return info_; }
  int64_t PageBytes(Pool pool, int page_rows) const override {
    return model_->PageBytes(static_cast<model::KvPool>(pool), page_rows);
  }
  int64_t RowsNeeded(Pool pool, int64_t num_positions) const override {
    return model::Dsv4Model::RowsNeeded(model_->config(), static_cast<model::KvPool>(pool), num_positions);
  }
  absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages, int page_rows, int slots) override {
    return model_->AllocateCache(pages, page_rows, slots);
  }
  absl::Status ResetState(int32_t slot) override { return model_->ResetState(slot); }
  absl::Status Forward(std::span<const SeqChunk> chunks, float* logits) override {
    tables_.resize(chunks.size());
    model_chunks_.resize(chunks.size());
    for (size_t i = 0; i < chunks.size(); ++i) {
      tables_[i].pages = chunks[i].tables->pages;
      tables_[i].state_slot = chunks[i].tables->state_slot;
      model_chunks_[i] = {.tables = &tables_[i], .tokens = chunks[i].tokens, .start_pos = chunks[i].start_pos};
    }
    return model_->Forward(model_chunks_, logits);
  }

 private:
  std::unique_ptr<model::Dsv4Model> model_;
  ModelInfo info_;
  std::vector<model::SeqBlockTables> tables_;
  std::vector<model::SeqChunk> model_chunks_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelExecutor>> LoadDsv4Executor(const Dsv4ExecutorOptions& o) {
  model::ModelOptions mo;
  mo.mode = o.mode == "production" ? model::NumericMode::kProduction : model::NumericMode::kExact;
  mo.tp_comm = o.tp_comm;
  mo.on_layer_loaded = o.on_layer_loaded;
  mo.num_threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<model::Dsv4Model> m, model::Dsv4Model::Load(o.checkpoint, mo));
  m->SetPhaseTimer(o.phase_timer);
  const Config& c = m->config();
  ModelInfo info;
  info.model_name = std::filesystem::path(o.checkpoint).lexically_normal().filename().string();
  if (info.model_name.empty()) info.model_name = std::filesystem::path(o.checkpoint).parent_path().filename();
  info.weight_format = c.hf_quant.has_value() ? "nvfp4-experts+fp8" : "mxfp4-experts+fp8";
  info.vocab_size = static_cast<int>(c.vocab_size);
  for (int64_t id : c.eos_token_ids) info.eos_token_ids.push_back(static_cast<int32_t>(id));
  info.bos_token_id = static_cast<int>(c.bos_token_id);
  info.num_layers = static_cast<int>(c.num_hidden_layers);
  return std::unique_ptr<ModelExecutor>(new Dsv4Executor(std::move(m), std::move(info)));
}

}  // namespace dsv4::worker
