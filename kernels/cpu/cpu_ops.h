// The fp32 CPU implementation of the ops interface (kernels/ops.h): the readable reference every other
// backend is checked against. Plain loops; GEMMs run blocked over all rows of a call (cpu_gemm.h) split over
// output features, attention over (token, head) pairs, the indexer over tokens, the compressor over sequences.
// Results never depend on the number of threads or on how many tokens share a call (each output element is
// one fixed-order reduction), so prefill and token-by-token decode agree bit for bit.
//
// Memory: after Reserve(limits) no op allocates for steps within the limits (scratch is per thread, sized
// once; growing it is the fallback for a caller that skipped Reserve). A bad argument makes the op do nothing
// and keeps the first error for TakeError (the backend returns it from Synchronize / CopyToHost).
//
// Threading: one caller thread at a time (the engine thread); the pool's workers only run inside an op.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ops.h"

namespace dsv4::kernels::cpu {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int num_threads);

  // Sizes every op's scratch for steps up to `limits` (only ever grows).
  void Reserve(const StepLimits& limits);
  // The first error since the last call (OK if none), cleared.
  absl::Status TakeError();
  // Bytes of scratch held (the backend counts them as MemoryKind::kWorkspace).
  int64_t scratch_bytes() const { return scratch_bytes_; }
  ThreadPool& pool() { return pool_; }
  int num_threads() const { return pool_.size(); }

  void Embed(const EmbedArgs& a) override;
  void Linear(const LinearArgs& a) override;
  void FusedLinear(const FusedLinearArgs& a) override;
  void RmsNorm(const RmsNormArgs& a) override;
  void Rope(const RopeArgs& a) override;
  void HcPre(const HcPreArgs& a) override;
  void HcPost(const HcPostArgs& a) override;
  void HcHead(const HcHeadArgs& a) override;
  void Scale(const ScaleArgs& a) override;
  void KvWindowWrite(const KvWindowWriteArgs& a) override;
  void Compressor(const CompressorArgs& a) override;
  void Indexer(const IndexerArgs& a) override;
  void Attention(const AttentionArgs& a) override;
  void Moe(const MoeArgs& a) override;
  void HadamardFp4(const HadamardFp4Args& a) override;
  void Fill(const FillArgs& a) override;
  void Sample(const SampleArgs& a) override;

 private:
  // One thread's scratch inside a parallel op.
  struct ThreadScratch {
    std::vector<const float*> key_ptr;  // [key_slots] the keys one token attends
    std::vector<float> keys;            // [key_slots, 512] FP8 keys decoded
    std::vector<float> scores;          // [max(key_slots, index_rows)]
    std::vector<int32_t> order;         // [index_rows]
    std::vector<double> acc;            // [head_dim]
    std::vector<float> row;             // [row_dim] one pooled / decoded row
    std::vector<uint64_t> sample;       // [vocab] the sampler's sort space
  };
  // Scratch of the MoE (the routing and the per-expert gathers run on the calling thread).
  struct MoeScratch {
    std::vector<float> logits, weight, score, key, x, g, h, out, acc;
    std::vector<int32_t> chosen, order, user_t, user_i;
  };
  struct Sizes {
    int64_t key_slots = 0, index_rows = 0, head_dim = 0, row_dim = 0;
    int64_t moe_tokens = 0, experts = 0, topk = 0, hidden = 0, inter = 0;
    int64_t vocab = 0;
  };

  void Fail(absl::Status s);
  // Grows scratch to at least `s` (no-op when already that large).
  void Grow(const Sizes& s);
  void GemmF32(const float* x, int64_t xs, const float* w, int64_t n, int64_t k, float* y, int64_t ys, int64_t t,
               int groups);

  ThreadPool pool_;
  std::vector<ThreadScratch> threads_;
  MoeScratch moe_;
  Sizes sizes_;
  int64_t scratch_bytes_ = 0;
  absl::Status error_;
};

}  // namespace dsv4::kernels::cpu
