// See fake_executor.h.
#include "tests/worker/fake_executor.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_sample.h"

namespace dsv4::worker::testing {
namespace {

constexpr int kRatio = 4;
constexpr uint64_t kStateSeed = 0x243F6A8885A308D3ull;

uint64_t Mix(uint64_t a, uint64_t b) {  // splitmix64 finaliser of a combined word
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void FillLogits(uint64_t digest, int vocab, float* out) {
  for (int v = 0; v < vocab; ++v) {
    out[v] = static_cast<float>(Mix(digest, static_cast<uint64_t>(v)) >> 40) / static_cast<float>(1 << 24) * 8.0f -
             4.0f;
  }
}

// The digest of what is visible at last_pos given the window entries, compressed rows and the partial state.
uint64_t Combine(std::span<const uint64_t> compressed, std::span<const uint64_t> window, uint64_t partial) {
  uint64_t d = 17;
  for (uint64_t c : compressed) d = Mix(d, c);
  for (uint64_t w : window) d = Mix(d, w);
  return Mix(d, partial);
}

}  // namespace

FakeExecutor::FakeExecutor(const FakeModelSpec& spec) : spec_(spec) {
  info_ = {.model_name = "fake", .weight_format = "none", .vocab_size = spec.vocab_size,
           .eos_token_ids = spec.eos, .bos_token_id = 0, .num_layers = 1, .checkpoint_fingerprint = "fake"};
}

int64_t FakeExecutor::PageBytes(Pool pool, int page_rows) const {
  return pool == Pool::kWindow || pool == Pool::kCompressed4 ? 8 * page_rows : 0;
}

int64_t FakeExecutor::RowsNeeded(Pool pool, int64_t n) const {
  if (pool == Pool::kWindow) return n > 0 ? spec_.window : 0;
  if (pool == Pool::kCompressed4) return n / kRatio;
  return 0;
}

absl::Status FakeExecutor::AllocateCache(const std::array<int64_t, kNumPools>& pages, int page_rows, int slots) {
  page_rows_ = page_rows;
  for (int p = 0; p < kNumPools; ++p) store_[p].assign(pages[p] * page_rows, 0xDEADull);
  state_.assign(slots, 0xDEADull);
  return absl::OkStatus();
}

absl::Status FakeExecutor::ResetState(int32_t slot) {
  if (slot < 0 || slot >= static_cast<int32_t>(state_.size())) {
    return absl::InternalError(absl::StrCat("fake: state slot ", slot, " out of range"));
  }
  state_[slot] = kStateSeed;
  return absl::OkStatus();
}

absl::StatusOr<uint64_t*> FakeExecutor::Row(const BlockTables& t, Pool pool, int64_t row) {
  const auto& pages = t.pages[static_cast<int>(pool)];
  const int64_t index = row / page_rows_;
  if (index >= static_cast<int64_t>(pages.size())) {
    return absl::InternalError(absl::StrCat("fake: ", kPoolNames[static_cast<int>(pool)], " row ", row,
                                            " has no page (table holds ", pages.size(), ")"));
  }
  return &store_[static_cast<int>(pool)][pages[index] * page_rows_ + row % page_rows_];
}

absl::Status FakeExecutor::Token(const BlockTables& t, int32_t token, int64_t pos) {
  DSV4_ASSIGN_OR_RETURN(uint64_t * w, Row(t, Pool::kWindow, pos % spec_.window));
  *w = Mix(static_cast<uint64_t>(token), static_cast<uint64_t>(pos));
  uint64_t& s = state_.at(t.state_slot);
  s = Mix(s, static_cast<uint64_t>(token));
  if ((pos + 1) % kRatio == 0) {
    DSV4_ASSIGN_OR_RETURN(uint64_t * c, Row(t, Pool::kCompressed4, pos / kRatio));
    *c = s;
    s = kStateSeed;
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FakeExecutor::Digest(const BlockTables& t, int64_t last) {
  std::vector<uint64_t> compressed, window;
  for (int64_t n = 0; n < (last + 1) / kRatio; ++n) {
    DSV4_ASSIGN_OR_RETURN(uint64_t * c, Row(t, Pool::kCompressed4, n));
    compressed.push_back(*c);
  }
  for (int64_t p = std::max<int64_t>(0, last - spec_.window + 1); p <= last; ++p) {
    DSV4_ASSIGN_OR_RETURN(uint64_t * w, Row(t, Pool::kWindow, p % spec_.window));
    window.push_back(*w);
  }
  return Combine(compressed, window, state_.at(t.state_slot));
}

absl::Status FakeExecutor::CopyStepLogits(std::span<const int> rows, float* out) {
  for (size_t j = 0; j < rows.size(); ++j) {
    if (rows[j] < 0 || (rows[j] + 1) * static_cast<size_t>(spec_.vocab_size) > step_logits_.size()) {
      return absl::InvalidArgumentError("fake: CopyStepLogits row out of the last step");
    }
    std::copy_n(step_logits_.data() + rows[j] * spec_.vocab_size, spec_.vocab_size, out + j * spec_.vocab_size);
  }
  return absl::OkStatus();
}

absl::Status FakeExecutor::Forward(std::span<const SeqChunk> chunks, float* logits) {
  logits_steps.fetch_add(1);
  if (fail_forwards.load() > 0) {
    fail_forwards.fetch_sub(1);
    return absl::InternalError("fake: injected forward failure");
  }
  if (const int64_t us = step_delay_us.load(); us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  max_chunks_seen.store(std::max(max_chunks_seen.load(), static_cast<int>(chunks.size())));
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SeqChunk& c = chunks[i];
    if (c.tables->state_slot < 0 || c.tables->state_slot >= static_cast<int32_t>(state_.size())) {
      return absl::InternalError("fake: chunk without a state slot");
    }
    for (size_t j = 0; j < c.tokens.size(); ++j) DSV4_RETURN_IF_ERROR(Token(*c.tables, c.tokens[j], c.start_pos + j));
    DSV4_ASSIGN_OR_RETURN(uint64_t d, Digest(*c.tables, c.start_pos + static_cast<int64_t>(c.tokens.size()) - 1));
    FillLogits(d, spec_.vocab_size, logits + i * spec_.vocab_size);
  }
  return absl::OkStatus();
}

absl::Status FakeExecutor::ForwardSample(std::span<const SeqChunk> chunks,
                                         std::span<const kernels::SampleParams> sampling, int32_t* tokens) {
  if (!spec_.sample_in_step) return ModelExecutor::ForwardSample(chunks, sampling, tokens);
  if (sampling.size() != chunks.size()) return absl::InvalidArgumentError("fake: one sampling row per chunk");
  std::vector<float>& logits = step_logits_;
  logits.assign(chunks.size() * spec_.vocab_size, 0.f);
  DSV4_RETURN_IF_ERROR(Forward(chunks, logits.data()));
  logits_steps.fetch_sub(1);  // Forward counted itself; this is a sampled step
  sampled_steps.fetch_add(1);
  std::vector<uint64_t> scratch(spec_.vocab_size);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const std::span<const float> row(logits.data() + i * spec_.vocab_size, spec_.vocab_size);
    tokens[i] = sampling[i].temperature < 0 ? -1 : kernels::cpu::SampleRow(row, sampling[i], scratch);
  }
  return absl::OkStatus();
}

std::vector<float> ReferenceLogits(const FakeModelSpec& spec, std::span<const int32_t> tokens) {
  std::vector<uint64_t> compressed, window;
  uint64_t s = kStateSeed;
  const int64_t last = static_cast<int64_t>(tokens.size()) - 1;
  for (int64_t p = 0; p <= last; ++p) {
    s = Mix(s, static_cast<uint64_t>(tokens[p]));
    if ((p + 1) % kRatio == 0) {
      compressed.push_back(s);
      s = kStateSeed;
    }
  }
  for (int64_t p = std::max<int64_t>(0, last - spec.window + 1); p <= last; ++p) {
    window.push_back(Mix(static_cast<uint64_t>(tokens[p]), static_cast<uint64_t>(p)));
  }
  std::vector<float> out(spec.vocab_size);
  FillLogits(Combine(compressed, window, s), spec.vocab_size, out.data());
  return out;
}

std::vector<int32_t> ReferenceGenerate(const FakeModelSpec& spec, const ReferenceRequest& r) {
  std::vector<int32_t> tokens = r.prompt, out;
  Sampler sampler;
  for (int i = 0; i < r.max_new_tokens; ++i) {
    const std::vector<float> logits = ReferenceLogits(spec, tokens);
    const int32_t t = sampler.Sample(logits, r.sampling, static_cast<uint64_t>(i));
    out.push_back(t);
    tokens.push_back(t);
    const bool stop = std::count(r.stop_token_ids.begin(), r.stop_token_ids.end(), t) > 0 ||
                      (!r.ignore_eos && std::count(spec.eos.begin(), spec.eos.end(), t) > 0);
    if (stop) break;
  }
  return out;
}

}  // namespace dsv4::worker::testing
