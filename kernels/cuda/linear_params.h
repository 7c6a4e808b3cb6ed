// The contract of the CUDA linear kernels (linear.cu), filled by LaunchLinear (linear.cc) from LinearArgs.
// Plain C++ with no library types so the .cu includes it.
//
//   y[t, g*N + n] = sum_k x[t, g*Kin + k] * W[g*N + n, k]     for t < T, g < groups, n < N, k < Kin
//
// Formats: kFp8 (e4m3 bytes + f32 block scales [ceil(groups*N/128), ceil(Kin/128)], the prepared form of the
// checkpoint's ue8m0 or f32 scales), kBf16 (W as bf16 bits) - both through the tensor-core kernel: x rounded to
// bf16, e4m3 -> bf16 exact in registers, bf16 mma.sync with fp32 accumulation, the block scale applied in fp32
// per 64-wide K step. kF32: a plain fp32 SIMT kernel (x not rounded; the model has no F32 linears, tests do).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace dsv4::kernels::cuda {

enum class LinearKernelFormat { kFp8, kBf16, kF32 };

// Which tensor-core kernel a plan runs (both compute the same sums; plans differ only in summation order).
//   kTiled  - the first kernel: every warp loads its weights and x straight from global memory, one step ahead;
//             K split over the warps of a block. Kept for prefill (T > kSplitMaxTokens) where it has tiles to spare.
//   kSplitK - decode (T <= kSplitMaxTokens): x staged once per block in shared memory as bf16, each warp keeps
//             several 64-wide weight steps in flight (in registers, or for FP8 with stages > 0 in a shared-memory
//             ring filled by cp.async), K split over the warps of a block AND over the blocks of a
//             thread-block cluster (up to 8), the partial sums added through distributed shared memory in a
//             fixed order, so every weight shape fills the GPU and results are deterministic.
//   kWgmma  - sm_90a only (linear_wgmma.cu), FP8 weights, chosen from 33 tokens: a block of two warpgroups takes
//             row_tiles tiles of 128 weight rows x 64 (or 16) tokens in turn; x staged once per block as bf16 (its K slice), the
//             weights streamed through a 4-stage cp.async ring and dequantised in registers into wgmma's A operand
//             (m64n64k16, x as B from shared memory); K split over a thread-block cluster (<= 8) added in a fixed
//             order. Runs through the multi-weight launch (FusedLinearParams), so single, grouped and fused linears
//             all take it.
enum class LinearKernel { kTiled, kSplitK, kWgmma };

// Largest token count the split-K kernel takes (4 token tiles of 32); more goes to kTiled.
inline constexpr int64_t kSplitMaxTokens = 128;
// Warps of a split-K block (warps_m * warps_k) and its shared memory: the x slice [8*n_tiles, k_slice + 4] bf16
// (<= kSplitXBytes) + the partial sums [warps][4*m_tiles*n_tiles][32 lanes] f32 (<= 32 KB): two blocks fit an SM.
// The total is capped at 99 KB, sm_120's (and sm_86/89's) per-block opt-in: the launchers raise each split-K
// kernel's limit to kSplitMaxSharedBytes, and above a device's opt-in that raise fails (every linear would then
// return the error). The largest x slice any flash plan takes is 65,792 bytes (n_tiles 4, k_slice 1024), so the
// plans are the same as with the earlier 68 KB (`dsv4-gemm-bench --plans`, sms 132 and 170: identical).
inline constexpr int kSplitWarps = 8;
inline constexpr int64_t kSplitXBytes = 67 * 1024 - 16;
inline constexpr int64_t kSplitMaxSharedBytes = kSplitXBytes + 16 + 32 * 1024;
inline constexpr int64_t kSm120OptinSharedBytes = 99 * 1024;
static_assert(kSplitMaxSharedBytes <= kSm120OptinSharedBytes, "split-K shared memory above sm_120's opt-in");
// FP8 split-K plans with a shared-memory weight ring (LinearPlan::stages > 0, linear_ring.cu): each warp streams
// its 16-row x 128-K steps (kRingTileBytes) with cp.async into `stages` slots of its own (each + 16 bytes for the
// step's block scale), so the bytes in flight no longer depend on registers. A block may then use up to
// kStreamMaxSharedBytes (the H100/H200 opt-in limit; a device with less gets fewer stages or the register ring:
// linear.cc).
inline constexpr int64_t kRingTileBytes = 2048;
inline constexpr int64_t kStreamMaxSharedBytes = 227 * 1024;
inline constexpr int kMaxStages = 4;

// The wgmma kernel's tile and limits (kWgmma): rows per tile (64 per warpgroup; an entry's first row and its
// block-scale row must be 64-aligned so each warpgroup reads one scale per 128-wide step), tokens per block (wgmma
// N), the largest K slice a block stages (x [64, k_slice] bf16 = 128 KB) and the weight ring's depth.
inline constexpr int kWgmmaRows = 128;
inline constexpr int kWgmmaTokens = 64;  // the largest token tile; 16 is the other (LinearPlan::n_tiles 2 / 8)
inline constexpr int64_t kWgmmaMaxKSlice = 1024;
inline constexpr int kWgmmaStages = 4;

// Work split of the tensor-core kernels, planned on the host from (groups, N, T, Kin): each warp computes
// 16*m_tiles rows x 8*n_tiles tokens over its share of the 64-wide K steps. kTiled: a block holds warps_m x
// warps_k warps, warp wk takes every warps_k-th step, and the warps_k partial sums are added in shared memory in
// a fixed order. kSplitK: a cluster of `cluster` blocks (grid x) splits K into slices of k_slice elements; inside
// a block warp wk takes every warps_k-th step of the block's slice; all cluster * warps_k partial sums of an
// output are added in a fixed order (block rank, then warp). Either way results are deterministic.
struct LinearPlan {
  LinearKernel kernel = LinearKernel::kTiled;
  int m_tiles = 2;   // MW: 16-row MMA tiles per warp (1 or 2)
  int n_tiles = 1;   // NW: 8-token MMA tiles per warp (1, 2 or 4; 8 in the multi-weight kernel's default build)
  int warps_m = 8;   // WM
  int warps_k = 1;   // WK (kTiled: warps_m * warps_k <= 16; kSplitK: <= kSplitWarps)
  int cluster = 1;   // kSplitK: blocks of a cluster splitting K (1, 2, 4 or 8)
  int64_t k_slice = 0;  // kSplitK: K elements per block (a multiple of 128; cluster * k_slice >= Kin)
  int stages = 0;       // kSplitK, FP8, m_tiles 1: 0 = register ring; 2..kMaxStages = ring slots per warp
  // kSplitK with stages 0 and m_tiles 1: 0 = LinearSplitKernel (linear.cu); kFusedMinBlocks or kFusedLeanBlocks =
  // the multi-weight split-K kernel (linear_fused.cu) compiled for that many 8-warp blocks per SM by its launch
  // bounds (<= 128 / <= 64 registers a thread; the lean one keeps one step per warp in flight instead of two, so
  // twice the warps fit; one token tile only), which also serves a single (grouped) linear.
  int min_blocks = 0;
  // The multi-weight kernel's FP8 dequantisation: false = hardware e4m3 -> f16 -> f32 -> bf16 (4 instructions
  // per 2 elements), true = the bit moves of e4m3_bits.h (3; values scaled by 2^-120, undone in fp32).
  bool bit_dequant = false;
  // kWgmma: 128-row tiles one block computes in turn (1..), so the x slice it stages serves all of them (x is read
  // from L2 once per block, not once per tile); cluster and k_slice as kSplitK; n_tiles 2 or 8: 16 or 64 tokens a
  // block (WgmmaPlanTokens).
  int row_tiles = 1;
};

// Tokens a block of a kWgmma plan takes (wgmma N): 8 * n_tiles, 16 or 64.
inline int WgmmaPlanTokens(const LinearPlan& plan) { return 8 * plan.n_tiles; }

// LinearPlan::min_blocks of the multi-weight kernel: the default build (2 blocks, two weight steps in flight per
// warp, as LinearSplitKernel) and the lean one (4 blocks, one step in flight, <= 64 registers; up to 8 tokens).
inline constexpr int kFusedMinBlocks = 2;
inline constexpr int kFusedLeanBlocks = 4;
// Most weights one multi-weight launch takes (ops.h kMaxFusedLinears is the same number).
inline constexpr int kFusedMaxWeights = 8;

struct LinearParams {
  LinearKernelFormat format = LinearKernelFormat::kFp8;
  const void* w = nullptr;        // [groups*N, Kin]: e4m3 bytes, bf16 bits or f32
  const float* scale = nullptr;   // kFp8: [ceil(groups*N/128), scale_cols] f32; else null
  int64_t scale_cols = 0;         // ceil(Kin/128)
  const void* x = nullptr;        // [T, x_stride]: f32 or bf16 bits (x_bf16)
  bool x_bf16 = false;
  float* y = nullptr;             // [T, y_stride] f32
  int64_t t = 0;                  // T
  int64_t n = 0;                  // N per group
  int64_t k = 0;                  // Kin per group
  int groups = 1;
  int64_t x_stride = 0, y_stride = 0;  // elements (already resolved: never 0)
  bool vec = false;               // 16-byte loads are aligned for W rows and x rows (host-checked)
  LinearPlan plan;
};

// One weight of a multi-weight launch (linear_fused.cu): y[t, r] = sum_k x[t, x_col + k] * W[r, k] for r < n.
struct FusedLinearEntry {
  LinearKernelFormat format = LinearKernelFormat::kFp8;  // kFp8 or kBf16
  const void* w = nullptr;       // this weight's first row: [n, Kin] e4m3 bytes or bf16 bits
  const float* scale = nullptr;  // kFp8: the whole weight's [ceil(rows/128), scale_cols] f32 block scales
  int64_t scale_cols = 0;        // ceil(Kin/128)
  int64_t scale_row0 = 0;        // kFp8: row of the whole weight that w's row 0 is (a group's g * N), for its scales
  int64_t n = 0;                 // rows
  int64_t x_col = 0;             // first x element of a row this weight reads (a group's g * Kin)
  float* y = nullptr;            // [T, y_stride] f32, columns [0, n)
  int64_t y_stride = 0;
  bool vec = false;              // 16-byte loads are aligned for W rows and x rows (host-checked)
  int64_t block0 = 0;            // first row block (grid z) of this weight; its row blocks follow
};

// A multi-weight launch: every weight reads the same x [T, x_stride] with the same Kin, one kSplitK plan (m_tiles 1,
// min_blocks > 0) for all; grid (cluster, token tiles, the weights' row blocks in order).
struct FusedLinearParams {
  const void* x = nullptr;  // f32 or bf16 bits (x_bf16)
  bool x_bf16 = false;
  int64_t x_stride = 0;
  int64_t t = 0;            // T
  int64_t k = 0;            // Kin
  int64_t x_rows = 0;       // token rows of the x slice in shared memory: min(T, 8 * n_tiles)
  int count = 0;
  FusedLinearEntry e[kFusedMaxWeights];
  LinearPlan plan;
};

namespace internal {
// Enqueues the multi-weight kernel for `p` (sizes already validated); returns the launch error, if any.
cudaError_t LaunchFusedLinearKernel(const FusedLinearParams& p, cudaStream_t stream);
// Dynamic shared memory of the multi-weight kernel: the x slice [x_rows, k_slice + 4] bf16 and the partial sums.
int64_t FusedSharedBytes(const LinearPlan& plan, int64_t x_rows);
// The wgmma kernel (linear_wgmma.cu) over the entries of `p` (a kWgmma plan, checked by the caller): whether this
// build has it (90a in CMAKE_CUDA_ARCHITECTURES), its dynamic shared memory for a K slice, and its launch.
bool LinearWgmmaBuilt();
int64_t WgmmaSharedBytes(int64_t k_slice, int cluster, int tokens);
cudaError_t LaunchLinearWgmmaKernel(const FusedLinearParams& p, cudaStream_t stream);
// Clusters of `cluster` (1, 2, 4, 8) of the kernel's largest blocks the current device holds at once
// (cudaOccupancyMaxActiveClusters); 0 where it cannot say.
int WgmmaMaxActiveClusters(int cluster, int tokens);
// Enqueues the kernel for `p` (sizes already validated); returns the launch error, if any.
cudaError_t LaunchLinearKernel(const LinearParams& p, cudaStream_t stream);
// Dynamic shared memory the tensor-core kernel of `plan` takes (kTiled: the split-K reduction; kSplitK: the x
// slice, the partial sums and, with stages > 0, the weight ring).
int64_t LinearSharedBytes(const LinearPlan& plan);
// The most dynamic shared memory a ring plan may take on the current device (its opt-in limit, at most
// kStreamMaxSharedBytes).
int64_t LinearMaxSharedBytes();
// The FP8 weight-ring kernel (linear_ring.cu) for a kSplitK plan with stages > 0 and m_tiles 1.
cudaError_t LaunchLinearRingKernel(const LinearParams& p, cudaStream_t stream);
}  // namespace internal

}  // namespace dsv4::kernels::cuda
