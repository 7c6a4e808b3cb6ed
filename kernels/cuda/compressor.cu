// Compressor on the device (ops.h; dsv4-decode.md §2.3): the softmax-pooling compressor of every sequence of the
// step, with the emitted rows RMS-normalised, rotated, optionally Hadamard + FP4-simulated and written to the
// compressed (or indexer) pool.
//
// Stepping a sequence's tokens one by one is what ops.h defines, but the state is only a window of raw
// (kv, gate + ape) values: the value a state row holds at any moment is one token's input. So every emission of
// the step can be computed at once from the step's inputs and the state as it was before the step, and the
// state after the step is the latest inputs per row. This gives the same floats as stepping (the same values
// are pooled in the same order) while a prefill chunk's emissions run in parallel instead of in a chain.
//
// Grid (1 + extra emission blocks, B); one block of d threads per emitted row, thread j owning pooled dim j
// (and state columns j and d + j for the two halves of ratio 4), so the row reductions of the emission (RMSNorm,
// the Hadamard butterflies, the FP8 / FP4 block scales) stay inside one block. Block 0 of a sequence is the
// only one that reads or writes its state: it computes the emissions that pool pre-step state rows (the first
// one; for ratio 4 the first two, whose "previous half" may be old), then writes the new state. The other
// blocks compute later emissions from the inputs alone, so nothing races.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_launch_util.h"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

constexpr int kMaxDim = 1024;  // d <= threads of one block

// The kernel's contract (CompressorArgs plus what the launcher derives from it).
struct CompressorParams {
  float* state_kv = nullptr;        // [slots, C*R, C*d]
  float* state_score = nullptr;     // [slots, C*R, C*d]
  int64_t state_stride = 0;         // floats between slots
  const float* kv = nullptr;        // [T, C*d]
  const float* gate = nullptr;      // [T, C*d]
  const float* ape = nullptr;       // [R, C*d]
  const float* norm_w = nullptr;    // [d]
  const float* inv_freq = nullptr;  // [pairs]
  KvCacheView cache;                // destination pool (row n = p / R of the sequence)
  BlockTables tables;
  StepIndex step;
  int ratio = 4, d = 512, pairs = 32;
  int halves = 2;                   // C: 2 for ratio 4 (overlapping windows), else 1
  int state_emissions = 2;          // emissions block 0 computes (those that may pool pre-step state)
  float eps = 1e-6f;
  bool hadamard_fp4 = false;
  float hadamard_norm = 1.f;        // 1 / sqrt(d), computed on the host as the CPU does
};

// One sequence of the step as the blocks see it.
struct SeqCtx {
  int64_t b = 0, first = 0;  // sequence, its first token
  int32_t p0 = 0, p_end = 0;  // first and last position of the step
  float* state_kv = nullptr;  // this sequence's state slot
  float* state_score = nullptr;
};

// The (kv, score) candidate of position q in state column col: this step's input when q >= p0, else the
// state row that holds q (ratio 4: rows 4.. the current window, rows 0..3 the previous one).
__device__ void Candidate(const CompressorParams& p, const SeqCtx& s, int32_t q, int col, float& kv,
                          float& score) {
  const int64_t cd = int64_t{p.halves} * p.d;
  if (q >= s.p0) {
    const int64_t t = s.first + (q - s.p0);
    kv = p.kv[t * cd + col];
    score = p.gate[t * cd + col] + p.ape[(q % p.ratio) * cd + col];
    return;
  }
  int row;
  if (p.halves == 1) {
    row = q % p.ratio;
  } else {
    const int32_t w0 = s.p0 / p.ratio * p.ratio;  // first position of the window holding p0
    row = q >= w0 ? p.ratio + (q - w0) : q - (w0 - p.ratio);
  }
  kv = s.state_kv[row * cd + col];
  score = s.state_score[row * cd + col];
}

// Candidate i of pooled dim j for window w: ratio 4 pools column j of the previous window (i < 4) and column
// d + j of this one; otherwise column j of the window's R positions.
__device__ void PoolCandidate(const CompressorParams& p, const SeqCtx& s, int32_t w, int i, int j, float& kv,
                              float& score) {
  if (p.halves == 2) {
    if (i < p.ratio) {
      Candidate(p, s, (w - 1) * p.ratio + i, j, kv, score);
    } else {
      Candidate(p, s, w * p.ratio + i - p.ratio, p.d + j, kv, score);
    }
  } else {
    Candidate(p, s, w * p.ratio + i, j, kv, score);
  }
}

// Per-dimension softmax pooling, as the CPU: max in float, sums in double.
__device__ float PoolDim(const CompressorParams& p, const SeqCtx& s, int32_t w, int j) {
  const int n = p.halves * p.ratio;
  float mx = -INFINITY, kv, score;
  for (int i = 0; i < n; ++i) {
    PoolCandidate(p, s, w, i, j, kv, score);
    mx = fmaxf(mx, score);
  }
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    PoolCandidate(p, s, w, i, j, kv, score);
    const double e = exp(static_cast<double>(score) - mx);
    den += e;
    num += e * kv;
  }
  return static_cast<float>(num / den);
}

// Sum over the block (every thread gets the same value, summed in the same order).
__device__ double BlockSum(double v, double* red) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(attn::kFullMask, v, o);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  double total = 0;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total += red[i];
  __syncthreads();  // red is reused by the next call
  return total;
}

// Pools window w of sequence s and writes its row n = w (the emission at position w*R + R - 1).
__device__ void Emit(const CompressorParams& p, const SeqCtx& s, int32_t w, float* buf, double* red) {
  const int j = threadIdx.x;
  float v = PoolDim(p, s, w, j);

  // RMSNorm (sum of squares in double, as the CPU) with the weight.
  const double ss = BlockSum(static_cast<double>(v) * v, red);
  const float inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(p.d) + p.eps));
  v = __fmul_rn(__fmul_rn(v, inv), p.norm_w[j]);

  // RoPE of the last 2 * pairs dims at the window's first position (pairs are lanes j, j ^ 1 of one warp).
  const float other = __shfl_xor_sync(attn::kFullMask, v, 1);
  const int r0 = p.d - 2 * p.pairs;
  if (j >= r0) {
    const float angle = __fmul_rn(static_cast<float>(w * p.ratio), p.inv_freq[(j - r0) >> 1]);
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float sn = static_cast<float>(sin(static_cast<double>(angle)));
    v = ((j - r0) & 1) == 0 ? __fsub_rn(__fmul_rn(v, c), __fmul_rn(other, sn))
                            : __fadd_rn(__fmul_rn(other, sn), __fmul_rn(v, c));
  }

  if (p.hadamard_fp4) {
    // Fast Walsh-Hadamard transform in the CPU's butterfly order (Sylvester), then H / sqrt(d).
    for (int h = 1; h < 32; h <<= 1) {
      const float o = __shfl_xor_sync(attn::kFullMask, v, h);
      v = (j & h) ? __fsub_rn(o, v) : __fadd_rn(v, o);
    }
    for (int h = 32; h < p.d; h <<= 1) {
      buf[j] = v;
      __syncthreads();
      const float o = buf[j ^ h];
      __syncthreads();
      v = (j & h) ? __fsub_rn(o, v) : __fadd_rn(v, o);
    }
    v = __fmul_rn(v, p.hadamard_norm);
    // FP4 e2m1 round trip, one ue8m0 scale per 32 dims (one warp).
    const float amax = fmaxf(1e-4f, attn::WarpMax(fabsf(v)));
    const float scale = Ue8m0ToF32(Ue8m0CeilFromF32(amax / 6.f));
    v = __fmul_rn(E2m1ToF32(F32ToE2m1(v / scale)), scale);
  }

  const int64_t row = attn::PhysicalRow(p.tables, s.b, w, p.cache.page_rows);
  if (row < 0) return;  // block-uniform: no page for this row
  if (p.cache.format == KvFormat::kF32) {
    attn::F32Row(p.cache, row)[j] = v;
    return;
  }
  buf[j] = v;
  __syncthreads();
  if (j < 256) attn::EncodeFp8Row(buf, p.cache, row);
  __syncthreads();  // buf is reused by the next emission
}

// The state after the step: each row holds the latest input of its residue; ratio 4 also moves the last
// emitted window into rows 0..3 (read before rows 4.. are overwritten). Thread j owns columns j and d + j.
__device__ void UpdateState(const CompressorParams& p, const SeqCtx& s, int32_t emitted) {
  const int j = threadIdx.x, R = p.ratio;
  const int64_t cd = int64_t{p.halves} * p.d;
  const int32_t from = max(s.p0, s.p_end - R + 1);
  if (p.halves == 1) {
    for (int32_t q = from; q <= s.p_end; ++q) {
      float kv, score;
      Candidate(p, s, q, j, kv, score);
      s.state_kv[(q % R) * cd + j] = kv;
      s.state_score[(q % R) * cd + j] = score;
    }
    return;
  }
  float prev_kv[4][2], prev_score[4][2];  // halves == 2 only for ratio 4
  const int32_t w_last = ((s.p_end + 1) / R - 1) * R;  // first position of the last window emitted in the step
  if (emitted > 0) {
    for (int i = 0; i < 4; ++i) {
      for (int h = 0; h < 2; ++h) Candidate(p, s, w_last + i, j + h * p.d, prev_kv[i][h], prev_score[i][h]);
    }
  }
  for (int32_t q = from; q <= s.p_end; ++q) {
    for (int h = 0; h < 2; ++h) {
      float kv, score;
      Candidate(p, s, q, j + h * p.d, kv, score);
      s.state_kv[(R + q % R) * cd + j + h * p.d] = kv;
      s.state_score[(R + q % R) * cd + j + h * p.d] = score;
    }
  }
  if (emitted > 0) {
    for (int i = 0; i < 4; ++i) {
      for (int h = 0; h < 2; ++h) {
        s.state_kv[i * cd + j + h * p.d] = prev_kv[i][h];
        s.state_score[i * cd + j + h * p.d] = prev_score[i][h];
      }
    }
  }
}

__global__ void __launch_bounds__(kMaxDim) CompressorKernel(const CompressorParams p) {
  PdlEnter();
  __shared__ float buf[kMaxDim];
  __shared__ double red[kMaxDim / 32];
  SeqCtx s;
  s.b = blockIdx.y;
  const int32_t len = p.step.seq_len[s.b];
  if (len <= 0) return;  // padding sequence
  s.first = p.step.seq_first[s.b];
  s.p0 = p.step.pos[s.first];
  if (s.p0 < 0) return;
  s.p_end = s.p0 + len - 1;
  const int64_t slot = p.step.state_slot[s.b];
  if (slot < 0) return;
  s.state_kv = p.state_kv + slot * p.state_stride;
  s.state_score = p.state_score + slot * p.state_stride;
  const int32_t w_first = s.p0 / p.ratio;                      // window holding p0
  const int32_t emissions = (s.p_end + 1) / p.ratio - w_first;  // windows closing inside the step
  if (blockIdx.x == 0) {
    for (int32_t e = 0; e < min(emissions, p.state_emissions); ++e) Emit(p, s, w_first + e, buf, red);
    UpdateState(p, s, emissions);
  } else {
    const int32_t e = p.state_emissions + static_cast<int32_t>(blockIdx.x) - 1;
    if (e < emissions) Emit(p, s, w_first + e, buf, red);
  }
}

absl::Status Check(const CompressorArgs& a) {
  DSV4_RETURN_IF_ERROR(attn::CheckStepIndex(a.step, "Compressor"));
  DSV4_RETURN_IF_ERROR(attn::CheckPool(a.cache, "Compressor pool"));
  DSV4_RETURN_IF_ERROR(attn::CheckTables(a.tables, "Compressor tables"));
  if (a.step.state_slot == nullptr) return absl::InvalidArgumentError("Compressor: step.state_slot is null");
  if (a.state_kv == nullptr || a.state_score == nullptr || a.kv == nullptr || a.gate == nullptr ||
      a.ape == nullptr || a.norm_w == nullptr || (a.pairs > 0 && a.inv_freq == nullptr)) {
    return absl::InvalidArgumentError("Compressor: state_kv/state_score/kv/gate/ape/norm_w/inv_freq is null");
  }
  if (a.ratio < 1) return absl::InvalidArgumentError(absl::StrCat("Compressor: ratio is ", a.ratio));
  if (a.d < 64 || a.d > kMaxDim || a.d % 32 != 0 || a.d != a.cache.dim) {
    return absl::InvalidArgumentError(absl::StrCat("Compressor: d is ", a.d, " (pool dim ", a.cache.dim,
                                                   "); must be the pool's, a multiple of 32 in [64, 1024]"));
  }
  if (a.pairs < 0 || 2 * a.pairs > a.d) {
    return absl::InvalidArgumentError(absl::StrCat("Compressor: ", a.pairs, " rope pairs for d ", a.d));
  }
  if (a.hadamard_fp4 && (a.d & (a.d - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("Compressor: Hadamard needs a power-of-two d, got ", a.d));
  }
  const int64_t c = a.ratio == 4 ? 2 : 1;
  if (a.state_stride < c * a.ratio * c * a.d) {
    return absl::InvalidArgumentError(absl::StrCat("Compressor: state_stride ", a.state_stride, " < C*R*C*d = ",
                                                   c * a.ratio * c * a.d));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status LaunchCompressor(const CompressorArgs& a, cudaStream_t stream) {
  DSV4_RETURN_IF_ERROR(Check(a));
  if (a.step.t == 0 || a.step.b == 0) return absl::OkStatus();
  const int halves = a.ratio == 4 ? 2 : 1;
  const CompressorParams p{.state_kv = a.state_kv, .state_score = a.state_score, .state_stride = a.state_stride,
                           .kv = a.kv, .gate = a.gate, .ape = a.ape, .norm_w = a.norm_w, .inv_freq = a.inv_freq,
                           .cache = a.cache, .tables = a.tables, .step = a.step, .ratio = a.ratio, .d = a.d,
                           .pairs = a.pairs, .halves = halves, .state_emissions = halves, .eps = a.eps,
                           .hadamard_fp4 = a.hadamard_fp4,
                           .hadamard_norm = 1.f / std::sqrt(static_cast<float>(a.d))};
  // Emissions of one sequence: at most ceil(max_seq_len / R); block 0 takes the first `halves` of them.
  const int64_t most = (int64_t{a.step.max_seq_len} + a.ratio - 1) / a.ratio;
  const int64_t blocks_x = 1 + std::max<int64_t>(0, most - halves);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(a.step.b));
  return CudaStatus(LaunchPdl(CompressorKernel, grid, dim3(a.d), 0, stream, p), "Compressor");
}

}  // namespace dsv4::kernels::cuda
