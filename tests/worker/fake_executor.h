// A deterministic fake model for fast engine tests: it keeps real paged state, so block-table mistakes show.
//
// Per token at position p it writes Mix(token, p) into window ring row p mod W (via the window block table)
// and folds the token into the sequence's state slot; every 4th token it writes the folded 4-token hash as
// compressed row p / 4 (via the compressed-4 block table). The logits of a chunk's last token are a hash of
// everything visible at that position read back from the pages: all compressed rows, the window rows and the
// partial state. ReferenceLogits computes the same numbers straight from the token list, so an engine that
// shares, frees or forgets pages wrongly produces different tokens than ReferenceGenerate.
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/model_executor.h"
#include "worker/sampler.h"

namespace dsv4::worker::testing {

struct FakeModelSpec {
  int vocab_size = 97;
  int window = 8;
  std::vector<int32_t> eos = {1};
  // Draw tokens inside the step (ForwardSample with the reference sampler, as a backend's Sample op does), so the
  // engine's path that passes sampling parameters and takes token ids is the one exercised.
  bool sample_in_step = false;
};

class FakeExecutor final : public ModelExecutor {
 public:
  explicit FakeExecutor(const FakeModelSpec& spec = {});
  const ModelInfo& info() const override { return info_; }
  int64_t PageBytes(Pool pool, int page_rows) const override;
  int64_t RowsNeeded(Pool pool, int64_t num_positions) const override;
  absl::Status AllocateCache(const std::array<int64_t, kNumPools>& pages, int page_rows, int slots) override;
  absl::Status ResetState(int32_t slot) override;
  absl::Status Forward(std::span<const SeqChunk> chunks, float* logits) override;
  bool SamplesInStep() const override { return spec_.sample_in_step; }
  absl::Status ForwardSample(std::span<const SeqChunk> chunks, std::span<const kernels::SampleParams> sampling,
                             int32_t* tokens) override;
  bool StepLogitsAvailable() const override { return spec_.sample_in_step; }
  absl::Status CopyStepLogits(std::span<const int> rows, float* out) override;

  // Test hooks (set before or while the engine runs).
  std::atomic<int> fail_forwards{0};       // the next N Forward calls fail with INTERNAL
  std::atomic<int64_t> step_delay_us{0};   // sleep per Forward, to keep requests in flight
  std::atomic<int> max_chunks_seen{0};
  std::atomic<int> sampled_steps{0}, logits_steps{0};  // ForwardSample / Forward calls from the engine

 private:
  absl::Status Token(const BlockTables& t, int32_t token, int64_t pos);
  absl::StatusOr<uint64_t> Digest(const BlockTables& t, int64_t last_pos);
  absl::StatusOr<uint64_t*> Row(const BlockTables& t, Pool pool, int64_t row);

  FakeModelSpec spec_;
  ModelInfo info_;
  int page_rows_ = 0;
  std::array<std::vector<uint64_t>, kNumPools> store_;
  std::vector<uint64_t> state_;
  std::vector<float> step_logits_;  // the last ForwardSample's logits (CopyStepLogits)
};

// The logits the fake gives after tokens[0..n) (n >= 1).
std::vector<float> ReferenceLogits(const FakeModelSpec& spec, std::span<const int32_t> tokens);

struct ReferenceRequest {
  std::vector<int32_t> prompt;
  SamplingConfig sampling;
  int max_new_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
};
// The tokens an engine must stream for this request on the fake model.
std::vector<int32_t> ReferenceGenerate(const FakeModelSpec& spec, const ReferenceRequest& request);

}  // namespace dsv4::worker::testing
