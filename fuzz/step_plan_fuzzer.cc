// Fuzz target: the byte stream a tensor-parallel follower receives from its leader on the control communicator
// ([8-byte length][serialised dsv4.comm.StepPlan], repeated), fed through RunFollower, the follower's whole receive
// loop: BroadcastBytes framing (length limit), parsing, ValidateStepPlan, the sequence check and the conversion of
// each plan into ModelExecutor calls. The executor below is a stand-in model that relies only on what
// ValidateStepPlan promises (comm/step_plan.h) and touches every token, page id and logit it is given, so a plan
// that reaches the model in a shape the follower did not check shows up as a sanitizer report or FUZZ_CHECK.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>

#include "comm/communicator.h"
#include "worker/lockstep.h"
#include "fuzz/fuzz_check.h"
#include "spdlog/spdlog.h"
#include "worker/model_executor.h"

namespace {

using dsv4::comm::Communicator;
using dsv4::worker::ModelExecutor;

// Rank 1 of 2 whose broadcasts deliver the fuzz input in order; at its end the leader "goes away" (UNAVAILABLE),
// as a closed Gloo connection does.
class ScriptedCommunicator final : public Communicator {
 public:
  explicit ScriptedCommunicator(std::span<const uint8_t> input) : input_(input) {}
  int rank() const override { return 1; }
  int world() const override { return 2; }
  std::string_view backend() const override { return "gloo"; }
  absl::Status AllReduceSum(float*, size_t) override { return Gone(); }
  absl::Status AllReduceSumBf16(uint16_t*, size_t) override { return Gone(); }
  absl::Status AllGather(const void*, void*, size_t) override { return Gone(); }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    FUZZ_CHECK(root == 0, "follower broadcast from root %d", root);
    if (bytes > input_.size() - pos_) return Gone();
    std::memcpy(data, input_.data() + pos_, bytes);
    pos_ += bytes;
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }

 private:
  static absl::Status Gone() { return absl::UnavailableError("scripted leader closed the connection"); }
  std::span<const uint8_t> input_;
  size_t pos_ = 0;
};

class CheckingExecutor final : public ModelExecutor {
 public:
  static constexpr int kVocab = 64;
  CheckingExecutor() { info_.vocab_size = kVocab; }
  const dsv4::worker::ModelInfo& info() const override { return info_; }
  int64_t PageBytes(dsv4::worker::Pool, int) const override { return 0; }
  int64_t RowsNeeded(dsv4::worker::Pool, int64_t n) const override { return n; }
  absl::Status AllocateCache(const std::array<int64_t, dsv4::worker::kNumPools>& pages, int page_rows,
                             int slots) override {
    for (int64_t p : pages) sum_ += static_cast<uint64_t>(p);
    sum_ += static_cast<uint64_t>(page_rows) + static_cast<uint64_t>(slots);
    return absl::OkStatus();
  }
  absl::Status ResetState(int32_t slot) override {
    sum_ += static_cast<uint64_t>(slot);
    return absl::OkStatus();
  }
  absl::Status Forward(std::span<const dsv4::worker::SeqChunk> chunks, float* logits) override {
    FUZZ_CHECK(!chunks.empty(), "Forward with no chunks");
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i];
      FUZZ_CHECK(c.tables != nullptr, "chunk %zu: tables is null", i);
      FUZZ_CHECK(!c.tokens.empty(), "chunk %zu: no tokens", i);
      FUZZ_CHECK(c.tables->state_slot >= 0 && c.start_pos >= 0, "chunk %zu: negative slot or position", i);
      for (int32_t t : c.tokens) sum_ += static_cast<uint32_t>(t);
      for (const auto& pool : c.tables->pages) {
        for (int32_t page : pool) sum_ += static_cast<uint32_t>(page);
      }
      std::fill_n(logits + i * kVocab, kVocab, 0.5f);  // the follower sized this buffer
    }
    return absl::OkStatus();
  }
  uint64_t sum() const { return sum_; }

 private:
  dsv4::worker::ModelInfo info_;
  uint64_t sum_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);  // refused plans are logged as warnings
    return true;
  }();
  (void)quiet;
  ScriptedCommunicator control({data, size});
  CheckingExecutor model;
  const absl::Status s = dsv4::worker::RunFollower(control, model);
  // The loop ends with OK only on a shutdown plan; otherwise with the communicator's or the framing's error.
  FUZZ_CHECK(!s.message().empty() || s.ok(), "an error without a message");
  volatile uint64_t sink = model.sum();
  (void)sink;
  return 0;
}
