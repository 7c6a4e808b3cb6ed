// The fp32 CPU backend of the ops interface: the readable reference every other backend is checked against.
// Plain loops; the large matrix-vector products, attention heads and experts are split over a small thread
// pool. Results never depend on the number of threads or on how many tokens share a call (each output element
// is one fixed-order reduction), so prefill and token-by-token decode agree exactly.
#pragma once

#include <memory>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/ops.h"

namespace dsv4::kernels::cpu {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(int num_threads);

  void Linear(const LinearArgs& a) override;
  void RmsNorm(const RmsNormArgs& a) override;
  void Rope(const RopeArgs& a) override;
  void HcPre(const HcPreArgs& a) override;
  void HcPost(const HcPostArgs& a) override;
  void HcHead(const HcHeadArgs& a) override;
  void Compressor(const CompressorArgs& a) override;
  void Indexer(const IndexerArgs& a) override;
  void Attention(const AttentionArgs& a) override;
  void Moe(const MoeArgs& a) override;
  void KvWrite(const KvWriteArgs& a) override;
  void Fp8RoundTrip(float* x, int64_t rows, int64_t dim, int64_t dims) override;
  void HadamardFp4RoundTrip(float* x, int64_t rows, int64_t dim) override;

  ThreadPool& pool() { return pool_; }

 private:
  ThreadPool pool_;
  // MoE scratch (grown on demand; the CPU backend may allocate, a GPU backend plans these up front).
  std::vector<float> moe_x_, moe_h_, moe_g_, moe_o_;
};

// Fixed-order fp32 dot product with 8 independent partial sums (vectorisable, deterministic).
float Dot(const float* a, const float* b, int64_t n);

// Reads physical row `row` of a pool as `cache.dim` floats (dequantising kFp8Row584).
void ReadKvRow(const KvCacheView& cache, int32_t row, float* out);
// Writes `cache.dim` floats to physical row `row` (quantising for kFp8Row584: e4m3 + ue8m0 per 64 nope dims,
// bf16 rope dims).
void WriteKvRow(const KvCacheView& cache, int32_t row, const float* in);
// Bytes of one page of page_rows rows for a row format (kFp8Row584: [P x 576 data][P x 8 scales], rounded up
// to a multiple of 576).
int64_t KvPageBytes(KvFormat format, int dim, int page_rows);

}  // namespace dsv4::kernels::cpu
