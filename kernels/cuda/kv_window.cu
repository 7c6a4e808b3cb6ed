// KvWindowWrite on the device (ops.h): the window pool's staging rows and ring rows, in fp32 or as the 584-byte
// FP8 record. One block per token of the step; the block decides from the device step index which rows (if
// any) the token writes in this phase, so a launch depends only on T.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention_launch_util.h"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda {
namespace {

using attn::fmt::kKvDim;

constexpr int kThreads = 256;  // 8 warps: 7 FP8 tiles + the rope dims (attn::EncodeFp8Row)

// The kernel's contract: KvWindowWriteArgs as ops.h defines it, copied by value.
struct KvWindowParams {
  const float* rows = nullptr;  // [T, dim] keys
  KvCacheView cache;            // window pool (kF32 rows of dim floats, or kFp8Row584 with dim 512)
  StepIndex step;               // pos / seq / seq_first / seq_len read on the device
  BlockTables tables;           // window pool: ceil(W / P) pages per sequence
  int32_t staging_row0 = 0;     // physical row of token 0's staging row
  int window = 128;             // W
  bool commit = false;          // phase (see ops.h)
};

// The rows token t writes in this phase: its staging row (phase 1) and/or its ring row; -1 = none.
__device__ void RowsOfToken(const KvWindowParams& p, int64_t t, int64_t& staging, int64_t& ring) {
  staging = ring = -1;
  const int32_t pos = p.step.pos[t];
  if (pos < 0) return;  // padding token
  const int32_t b = p.step.seq[t];
  const int64_t first = p.step.seq_first[b], len = p.step.seq_len[b];
  const bool ring_now = p.commit ? (t != first && t - first >= len - p.window) : t == first;
  if (!p.commit) staging = p.staging_row0 + t;
  if (ring_now) ring = attn::PhysicalRow(p.tables, b, pos % p.window, p.cache.page_rows);
}

__global__ void __launch_bounds__(kThreads) KvWindowWriteKernel(const KvWindowParams p) {
  PdlEnter();
  const int64_t t = blockIdx.x;
  int64_t staging, ring;
  RowsOfToken(p, t, staging, ring);
  if (staging < 0 && ring < 0) return;  // block-uniform
  const float* src = p.rows + t * p.cache.dim;
  if (p.cache.format == KvFormat::kF32) {
    for (int d = threadIdx.x; d < p.cache.dim; d += kThreads) {
      const float v = src[d];
      if (staging >= 0) attn::F32Row(p.cache, staging)[d] = v;
      if (ring >= 0) attn::F32Row(p.cache, ring)[d] = v;
    }
    return;
  }
  __shared__ float k[kKvDim];
  for (int d = threadIdx.x; d < kKvDim; d += kThreads) k[d] = src[d];
  __syncthreads();
  if (staging >= 0) attn::EncodeFp8Row(k, p.cache, staging);
  if (ring >= 0) attn::EncodeFp8Row(k, p.cache, ring);
}

}  // namespace

absl::Status LaunchKvWindowWrite(const KvWindowWriteArgs& a, cudaStream_t stream) {
  if (a.step.t < 0) return absl::InvalidArgumentError(absl::StrCat("KvWindowWrite: T is ", a.step.t));
  // Nothing to do: no tokens, or a decode-only step's commit (each sequence's one token was its first).
  if (a.step.t == 0 || (a.commit && a.step.max_seq_len <= 1)) return absl::OkStatus();
  DSV4_RETURN_IF_ERROR(attn::CheckStepIndex(a.step, "KvWindowWrite"));
  DSV4_RETURN_IF_ERROR(attn::CheckPool(a.cache, "KvWindowWrite window pool"));
  DSV4_RETURN_IF_ERROR(attn::CheckTables(a.tables, "KvWindowWrite window tables"));
  if (a.rows == nullptr) return absl::InvalidArgumentError("KvWindowWrite: rows is null");
  if (a.window < 1) return absl::InvalidArgumentError(absl::StrCat("KvWindowWrite: window is ", a.window));
  if (a.staging_row0 < 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvWindowWrite: staging_row0 is ", a.staging_row0));
  }
  if (a.staging_row0 + a.step.t > INT32_MAX) {
    return absl::InvalidArgumentError("KvWindowWrite: staging rows past int32 row ids");
  }
  const KvWindowParams p{.rows = a.rows, .cache = a.cache, .step = a.step, .tables = a.tables,
                         .staging_row0 = a.staging_row0, .window = a.window, .commit = a.commit};
  return CudaStatus(LaunchPdl(KvWindowWriteKernel, dim3(static_cast<unsigned>(a.step.t)), dim3(kThreads), 0, stream, p),
                    "KvWindowWrite");
}

}  // namespace dsv4::kernels::cuda
