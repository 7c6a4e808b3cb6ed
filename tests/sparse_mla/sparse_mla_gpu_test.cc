// The CUDA sparse-MLA kernels (MMA and SIMT) against the float64 reference on fresh random inputs: batch
// 1..128, top-k 128..640, H 16..128, with and without lengths, -1 holes, ids past the pool, rows with no
// valid key, extreme magnitudes, 16- and 32-row tiles, forced splits. Outputs are poisoned (NaN) before each
// run, so an unwritten element fails. Also: graph capture, determinism, launch-time validation.
// Tests whose names contain "Gpu" carry the ctest label gpu and skip with a message where no GPU is.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/float_formats.h"
#include "kernels/sparse_mla/sparse_mla_kernels.h"
#include "kernels/sparse_mla/sparse_mla_launch.h"
#include "tests/gpu_check/gpu_check.h"
#include "tests/sparse_mla/sparse_mla_test_util.h"

namespace dsv4::kernels::sparse_mla {
namespace {

using testing::Compare;
using testing::ErrorReport;
using testing::HostProblem;
using testing::MakeProblem;
using testing::ProblemSpec;

struct CudaFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DevicePtr = std::unique_ptr<void, CudaFree>;

DevicePtr Upload(const void* src, size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
  if (src != nullptr && cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaFree(p);
    return nullptr;
  }
  return DevicePtr(p);
}
template <typename T>
DevicePtr Upload(const std::vector<T>& v) {
  return Upload(v.data(), v.size() * sizeof(T));
}

// A host problem copied to the device, with output, LSE and workspace buffers.
class DeviceProblem {
 public:
  explicit DeviceProblem(const HostProblem& h)
      : host_(h),
        q_(Upload(h.q)),
        cache_w_(Upload(h.cache_window)),
        cache_e_(Upload(h.cache_extra)),
        idx_w_(Upload(h.idx_window)),
        idx_e_(Upload(h.idx_extra)),
        len_w_(Upload(h.len_window)),
        len_e_(Upload(h.len_extra)),
        sink_(Upload(h.sink)),
        out_(Upload(nullptr, h.q.size() * 2)),
        lse_(Upload(nullptr, static_cast<size_t>(h.spec.batch) * h.spec.heads * 4)) {}

  bool ok() const { return q_ && out_ && lse_; }

  SparseMlaParams Params() const {
    SparseMlaParams p = host_.Params(static_cast<uint16_t*>(out_.get()), static_cast<float*>(lse_.get()));
    p.q = static_cast<const uint16_t*>(q_.get());
    p.window.cache = static_cast<const uint8_t*>(cache_w_.get());
    p.window.indices = static_cast<const int32_t*>(idx_w_.get());
    p.window.lengths = static_cast<const int32_t*>(len_w_.get());
    p.extra.cache = static_cast<const uint8_t*>(cache_e_.get());
    p.extra.indices = static_cast<const int32_t*>(idx_e_.get());
    p.extra.lengths = static_cast<const int32_t*>(len_e_.get());
    p.attn_sink = static_cast<const float*>(sink_.get());
    p.workspace = ws_.get();
    p.workspace_bytes = ws_bytes_;
    return p;
  }

  bool EnsureWorkspace(size_t bytes) {
    if (bytes <= ws_bytes_) return true;
    ws_ = Upload(nullptr, bytes);
    ws_bytes_ = ws_ ? bytes : 0;
    return ws_ != nullptr;
  }

  // NaN everywhere (0xffff is a bf16 NaN, 0xffffffff an f32 NaN): unwritten elements fail the comparison.
  bool Poison() {
    return cudaMemset(out_.get(), 0xff, host_.q.size() * 2) == cudaSuccess &&
           cudaMemset(lse_.get(), 0xff, static_cast<size_t>(host_.spec.batch) * host_.spec.heads * 4) == cudaSuccess;
  }

  bool Download(std::vector<uint16_t>& out, std::vector<float>& lse) const {
    out.resize(host_.q.size());
    lse.resize(static_cast<size_t>(host_.spec.batch) * host_.spec.heads);
    return cudaMemcpy(out.data(), out_.get(), out.size() * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
           cudaMemcpy(lse.data(), lse_.get(), lse.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess;
  }

 private:
  const HostProblem& host_;
  DevicePtr q_, cache_w_, cache_e_, idx_w_, idx_e_, len_w_, len_e_, sink_, out_, lse_, ws_;
  size_t ws_bytes_ = 0;
};

struct RunOutput {
  std::vector<uint16_t> out;
  std::vector<float> lse;
  SparseMlaPlan plan;
};

// Plans, poisons, launches on the default stream, synchronises, downloads.
absl::StatusOr<RunOutput> RunKernel(DeviceProblem& dev, const ProblemSpec& s, SparseMlaKernel kernel,
                                    const SparseMlaPlanOptions& options) {
  RunOutput r;
  auto plan = MakeSparseMlaPlan(kernel, s.batch, s.heads, s.topk_window + s.topk_extra, options);
  if (!plan.ok()) return plan.status();
  r.plan = *plan;
  if (!dev.EnsureWorkspace(r.plan.workspace_bytes) || !dev.Poison()) return absl::InternalError("cuda alloc/memset");
  if (absl::Status st = LaunchSparseMlaDecode(dev.Params(), r.plan, nullptr); !st.ok()) return st;
  if (cudaError_t err = cudaDeviceSynchronize(); err != cudaSuccess) {
    return absl::InternalError(std::string("kernel failed: ") + cudaGetErrorString(err));
  }
  if (!dev.Download(r.out, r.lse)) return absl::InternalError("download");
  return r;
}

struct GpuCase {
  ProblemSpec spec;
  SparseMlaPlanOptions options;
};
// ctest lists parameters with this (gtest would otherwise dump the struct's bytes).
void PrintTo(const GpuCase& c, std::ostream* os) { *os << c.spec.Name(); }

class GpuSparseMla : public ::testing::TestWithParam<GpuCase> {};

// Whether the sm_90a wgmma kernel can run here (an sm_90a build on a compute capability 9.0 GPU).
bool WgmmaRuns() {
  int device = 0, major = 0, minor = 0;
  return internal::MmaWgmmaBuilt() && cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
         minor == 0;
}

// Whether a forced cluster merge (cluster_merge = 1) cannot run this case on this GPU. The cases are sized for
// sm_90 (H200: 132 SMs, 227 KB of shared memory), where a refusal is a failure; elsewhere (sm_120: less shared
// memory, other cluster limits; no clusters before sm_90) the plan's FailedPrecondition is a skip.
bool ClusterMergeUnavailable(const ProblemSpec& s, const SparseMlaPlanOptions& options) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    return true;
  }
  if (major == 9 && minor == 0) return false;
  auto plan = MakeSparseMlaPlan(SparseMlaKernel::kMma, s.batch, s.heads, s.topk_window + s.topk_extra, options);
  return !plan.ok() && plan.status().code() == absl::StatusCode::kFailedPrecondition;
}

TEST_P(GpuSparseMla, MatchesReference) {
  DSV4_SKIP_WITHOUT_GPU();
  if ((GetParam().options.wgmma == 1 || GetParam().options.wgmma_ws == 1) && !WgmmaRuns()) {
    GTEST_SKIP() << "the wgmma kernel needs an sm_90a build (90a in CMAKE_CUDA_ARCHITECTURES) on an sm_90 GPU";
  }
  if (GetParam().options.cluster_merge == 1 && ClusterMergeUnavailable(GetParam().spec, GetParam().options)) {
    GTEST_SKIP() << "this GPU cannot run the cluster merge for this case (sized for sm_90)";
  }
  const ProblemSpec& s = GetParam().spec;
  const HostProblem host = MakeProblem(s);
  std::vector<uint16_t> host_out(host.q.size());
  std::vector<float> host_lse(static_cast<size_t>(s.batch) * s.heads);
  auto ref = testing::ParallelReference(host.Params(host_out.data(), host_lse.data()));
  ASSERT_TRUE(ref.ok()) << ref.status();
  DeviceProblem dev(host);
  ASSERT_TRUE(dev.ok());
  for (const SparseMlaKernel kernel : {SparseMlaKernel::kMma, SparseMlaKernel::kSimt}) {
    const bool mma = kernel == SparseMlaKernel::kMma;
    auto run = RunKernel(dev, s, kernel, GetParam().options);
    ASSERT_TRUE(run.ok()) << run.status();
    const ErrorReport vs_bf16 = Compare(run->out, run->lse, *ref, s.batch, s.heads, /*round_ref=*/true);
    const ErrorReport vs_exact = Compare(run->out, run->lse, *ref, s.batch, s.heads, /*round_ref=*/false);
    std::printf("[%s] %s warps=%d wgmma=%d tile_rows=%d splits=%d%s\n  vs bf16-rounded reference: %s\n"
                "  vs exact reference:       %s\n",
                mma ? "mma " : "simt", s.Name().c_str(), run->plan.warps,
                run->plan.wgmma_ws ? 2 : run->plan.wgmma ? 1 : 0, run->plan.tile_rows,
                run->plan.num_splits, run->plan.cluster_merge ? " (cluster merge)" : "",
                vs_bf16.ToString().c_str(), vs_exact.ToString().c_str());
    const double tol = mma ? 1e-2 : 1e-4;
    EXPECT_EQ(vs_bf16.nan_count, 0);
    EXPECT_EQ(vs_bf16.empty_bad, 0);
    EXPECT_LE(vs_bf16.rel_global, tol);
    EXPECT_LE(vs_bf16.rel_worst_seq, 3 * tol);  // no sequence hides under the others' norm
    EXPECT_LE(vs_bf16.lse_max_abs, mma ? 1e-3 : 1e-4);
    if (mma) {
      // Same inputs, same launch: bit-identical results (a moving result would be a race).
      auto again = RunKernel(dev, s, kernel, GetParam().options);
      ASSERT_TRUE(again.ok()) << again.status();
      EXPECT_TRUE(again->out == run->out) << "MMA output changed between identical runs";
      EXPECT_EQ(std::memcmp(again->lse.data(), run->lse.data(), run->lse.size() * 4), 0);
    }
  }
}

GpuCase Case(ProblemSpec s, SparseMlaPlanOptions o = {}) { return GpuCase{s, o}; }

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuSparseMla,
    ::testing::Values(
        Case({.batch = 1, .heads = 64, .topk_window = 128, .topk_extra = 512, .seed = 101}),
        Case({.batch = 3, .heads = 16, .topk_window = 128, .topk_extra = 0, .lengths = true, .holes = 0.1, .seed = 102}),
        Case({.batch = 4, .heads = 128, .topk_window = 128, .topk_extra = 256, .lengths = true, .holes = 0.1,
              .extreme = true, .seed = 103}),
        Case({.batch = 16, .heads = 64, .topk_window = 64, .topk_extra = 448, .page_rows_window = 256,
              .page_rows_extra = 2, .holes = 0.1, .empty_every = 5, .extreme = true, .seed = 104}),
        Case({.batch = 32, .heads = 16, .topk_window = 128, .topk_extra = 512, .lengths = true, .holes = 0.1,
              .seed = 105}),
        Case({.batch = 64, .heads = 64, .topk_window = 128, .topk_extra = 256, .extreme = true, .sink = false,
              .seed = 106}),
        Case({.batch = 128, .heads = 64, .topk_window = 128, .topk_extra = 512, .seed = 107}),
        Case({.batch = 128, .heads = 128, .topk_window = 64, .topk_extra = 448, .lengths = true, .holes = 0.1,
              .empty_every = 7, .seed = 108}),
        Case({.batch = 3, .heads = 32, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 109}),
        Case({.batch = 64, .heads = 128, .topk_window = 128, .topk_extra = 0, .lengths = true, .seed = 110}),
        Case({.batch = 16, .heads = 32, .topk_window = 128, .topk_extra = 384, .lengths = true, .seed = 111},
             {.tile_rows = 16}),
        Case({.batch = 4, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 112},
             {.tile_rows = 16, .num_splits = 3}),
        Case({.batch = 128, .heads = 64, .topk_window = 128, .topk_extra = 512, .lengths = true, .seed = 113},
             {.num_splits = 2}),
        Case({.batch = 1, .heads = 16, .topk_window = 128, .topk_extra = 256, .holes = 0.1, .extreme = true,
              .seed = 114},
             {.tile_rows = 16}),
        Case({.batch = 32, .heads = 64, .topk_window = 128, .topk_extra = 512, .seed = 115}),
        Case({.batch = 4, .heads = 64, .topk_window = 5, .topk_extra = 7, .page_rows_window = 1, .seed = 116}),
        // The wide kernel with 64-head blocks (the automatic plan uses it only for few blocks), and the
        // 8-warp kernel where the automatic plan would pick the wide one.
        Case({.batch = 128, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 117},
             {.warps = 16}),
        Case({.batch = 32, .heads = 64, .topk_window = 128, .topk_extra = 512, .lengths = true, .holes = 0.1,
              .extreme = true, .seed = 122},
             {.warps = 16}),
        Case({.batch = 2, .heads = 64, .topk_window = 64, .topk_extra = 448, .empty_every = 2, .seed = 123},
             {.warps = 16, .m_tiles = 4}),
        Case({.batch = 3, .heads = 128, .topk_window = 128, .topk_extra = 256, .lengths = true, .extreme = true,
              .seed = 118},
             {.num_splits = 2, .warps = 8}),
        // The wide kernel with 16- and 32-head blocks (what the plan picks at small batch).
        Case({.batch = 4, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .extreme = true,
              .seed = 119},
             {.m_tiles = 1}),
        Case({.batch = 16, .heads = 128, .topk_window = 64, .topk_extra = 448, .lengths = true, .holes = 0.1,
              .empty_every = 5, .seed = 120},
             {.num_splits = 3, .m_tiles = 2}),
        Case({.batch = 1, .heads = 64, .topk_window = 128, .topk_extra = 512, .seed = 121}, {.m_tiles = 1}),
        // More splits than the combine kernel's shared (max, sum) buffer holds, 90 of them empty (8-warp
        // kernel, 16-row tiles) and 110 of them empty (wide kernel).
        Case({.batch = 2, .heads = 16, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 130},
             {.tile_rows = 16, .num_splits = 130}),
        Case({.batch = 2, .heads = 16, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 133},
             {.num_splits = 130, .warps = 16}),
        // The split combine with programmatic dependent launch, after each main kernel.
        Case({.batch = 32, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .empty_every = 6,
              .seed = 131},
             {.pdl = 1, .cluster_merge = -1}),
        Case({.batch = 2, .heads = 64, .topk_window = 128, .topk_extra = 448, .lengths = true, .extreme = true,
              .seed = 132},
             {.pdl = 1, .cluster_merge = -1}),
        // Fourth pass: batches that are not powers of two, top-k 200 (128 + 72) and 1000 (128 + 872), pages of
        // 64 and 256 rows, batches whose rows are all invalid (every sequence empty).
        Case({.batch = 48, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 140}),
        Case({.batch = 96, .heads = 64, .topk_window = 128, .topk_extra = 512, .page_rows_window = 256,
              .page_rows_extra = 64, .lengths = true, .seed = 141}),
        Case({.batch = 96, .heads = 16, .topk_window = 128, .topk_extra = 72, .holes = 0.1, .extreme = true,
              .seed = 142}),
        Case({.batch = 3, .heads = 64, .topk_window = 128, .topk_extra = 872, .page_rows_window = 64,
              .page_rows_extra = 256, .lengths = true, .seed = 143},
             {.warps = 8}),
        Case({.batch = 48, .heads = 128, .topk_window = 128, .topk_extra = 872, .page_rows_extra = 256,
              .holes = 0.1, .empty_every = 4, .seed = 144}),
        Case({.batch = 3, .heads = 64, .topk_window = 128, .topk_extra = 72, .page_rows_window = 256,
              .page_rows_extra = 256, .holes = 0.1, .seed = 145}),
        Case({.batch = 24, .heads = 32, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .empty_every = 1,
              .seed = 146}),
        Case({.batch = 5, .heads = 64, .topk_window = 128, .topk_extra = 512, .empty_every = 1, .seed = 147},
             {.tile_rows = 16, .warps = 8}),
        Case({.batch = 40, .heads = 64, .topk_window = 64, .topk_extra = 136, .lengths = true, .holes = 0.1,
              .seed = 148},
             {.tile_rows = 16}),
        // The sm_90a wgmma kernel forced (skipped where it cannot run), at shapes the plan would give the wide
        // kernel too; and the mma.sync 8-warp kernel forced where the plan picks wgmma on sm_90a.
        Case({.batch = 1, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 150},
             {.wgmma = 1}),
        Case({.batch = 3, .heads = 128, .topk_window = 128, .topk_extra = 872, .page_rows_extra = 256,
              .lengths = true, .extreme = true, .seed = 151},
             {.wgmma = 1}),
        Case({.batch = 5, .heads = 64, .topk_window = 128, .topk_extra = 512, .empty_every = 1, .seed = 152},
             {.wgmma = 1}),
        Case({.batch = 16, .heads = 64, .topk_window = 64, .topk_extra = 448, .page_rows_window = 256,
              .page_rows_extra = 2, .holes = 0.1, .empty_every = 5, .extreme = true, .sink = false, .seed = 153},
             {.num_splits = 3, .wgmma = 1, .cluster_merge = -1}),
        Case({.batch = 4, .heads = 64, .topk_window = 5, .topk_extra = 7, .page_rows_window = 1, .seed = 154},
             {.wgmma = 1}),
        Case({.batch = 128, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 155},
             {.wgmma = -1}),
        Case({.batch = 64, .heads = 128, .topk_window = 128, .topk_extra = 512, .lengths = true, .seed = 156},
             {.wgmma = -1}),
        Case({.batch = 96, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .empty_every = 7,
              .seed = 157},
             {.wgmma = -1}),
        // Fifth pass: the plan's wgmma kernel is the warp-specialised one (the forced cases above and the
        // automatic B >= 48 cases run it); the fourth pass's two-warpgroup wgmma kernel stays tested here.
        Case({.batch = 1, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 160},
             {.wgmma = 1, .wgmma_ws = -1}),
        Case({.batch = 5, .heads = 64, .topk_window = 128, .topk_extra = 512, .empty_every = 1, .seed = 161},
             {.wgmma = 1, .wgmma_ws = -1}),
        Case({.batch = 64, .heads = 128, .topk_window = 128, .topk_extra = 872, .page_rows_extra = 256,
              .lengths = true, .holes = 0.1, .extreme = true, .seed = 162},
             {.wgmma = 1, .wgmma_ws = -1}),
        // The warp-specialised kernel: one and two tiles per block (the hand-off barriers' edge cases), odd
        // splits, and long blocks (K = 1000: 32 tiles through the two bf16 buffers).
        Case({.batch = 7, .heads = 64, .topk_window = 20, .topk_extra = 12, .lengths = true, .seed = 163},
             {.wgmma = 1, .wgmma_ws = 1}),
        Case({.batch = 6, .heads = 64, .topk_window = 64, .topk_extra = 0, .holes = 0.1, .seed = 164},
             {.wgmma = 1, .wgmma_ws = 1}),
        Case({.batch = 9, .heads = 128, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .empty_every = 3,
              .seed = 165},
             {.num_splits = 3, .wgmma = 1, .wgmma_ws = 1, .cluster_merge = -1}),
        Case({.batch = 16, .heads = 64, .topk_window = 64, .topk_extra = 448, .page_rows_window = 256,
              .page_rows_extra = 2, .holes = 0.1, .empty_every = 5, .extreme = true, .seed = 168},
             {.num_splits = 3, .wgmma = 1, .wgmma_ws = 1}),
        Case({.batch = 2, .heads = 64, .topk_window = 128, .topk_extra = 872, .page_rows_window = 64,
              .page_rows_extra = 256, .extreme = true, .seed = 166},
             {.num_splits = 1, .wgmma = 1, .wgmma_ws = 1}),
        Case({.batch = 2, .heads = 64, .topk_window = 128, .topk_extra = 872, .page_rows_window = 64,
              .page_rows_extra = 256, .lengths = true, .holes = 0.1, .seed = 169},
             {.num_splits = 1, .wgmma = 1, .wgmma_ws = 1}),
        // Sixth pass: the splits merged inside a thread-block cluster (the plan's choice on sm_90 for the
        // mma.sync kernels; the cases above with splits run it where they fit) and the combine kernel kept
        // where the plan would merge in a cluster. Cluster sizes 2 to 16, the wide and the 8-warp kernel, empty
        // and all-invalid sequences, no sink, H = 128 (two head groups, two clusters per sequence).
        Case({.batch = 1, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .extreme = true,
              .seed = 170},
             {.cluster_merge = 1}),
        Case({.batch = 1, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 171},
             {.cluster_merge = -1}),
        Case({.batch = 2, .heads = 16, .topk_window = 128, .topk_extra = 384, .lengths = true, .holes = 0.1,
              .seed = 172},
             {.num_splits = 16, .cluster_merge = 1}),
        Case({.batch = 16, .heads = 64, .topk_window = 64, .topk_extra = 448, .page_rows_window = 256,
              .page_rows_extra = 2, .holes = 0.1, .empty_every = 5, .extreme = true, .sink = false, .seed = 173},
             {.cluster_merge = 1}),
        Case({.batch = 32, .heads = 64, .topk_window = 128, .topk_extra = 512, .lengths = true, .seed = 174},
             {.cluster_merge = -1}),
        Case({.batch = 5, .heads = 128, .topk_window = 128, .topk_extra = 872, .page_rows_extra = 256,
              .lengths = true, .holes = 0.1, .empty_every = 3, .seed = 175},
             {.num_splits = 2, .warps = 8, .cluster_merge = 1}),
        Case({.batch = 6, .heads = 32, .topk_window = 128, .topk_extra = 512, .empty_every = 1, .seed = 176},
             {.num_splits = 5, .cluster_merge = 1}),
        Case({.batch = 3, .heads = 64, .topk_window = 20, .topk_extra = 12, .lengths = true, .seed = 177},
             {.num_splits = 7, .warps = 8, .m_tiles = 4, .cluster_merge = 1}),
        // Seventh pass: the cluster merge in both wgmma kernels (the warp-specialised one merges on its consumer
        // warpgroups after the producer has returned): 2 to 8 splits, H = 128 (two clusters a sequence), empty
        // and all-invalid sequences, the automatic split count of B = 48.
        Case({.batch = 4, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .extreme = true,
              .seed = 178},
             {.num_splits = 2, .wgmma = 1, .wgmma_ws = 1, .cluster_merge = 1}),
        Case({.batch = 3, .heads = 128, .topk_window = 128, .topk_extra = 872, .page_rows_extra = 256,
              .lengths = true, .holes = 0.1, .empty_every = 3, .seed = 179},
             {.num_splits = 4, .wgmma = 1, .wgmma_ws = -1, .cluster_merge = 1}),
        Case({.batch = 2, .heads = 64, .topk_window = 128, .topk_extra = 872, .page_rows_window = 64,
              .page_rows_extra = 256, .lengths = true, .seed = 184},
             {.num_splits = 8, .wgmma = 1, .wgmma_ws = 1, .cluster_merge = 1}),
        Case({.batch = 5, .heads = 64, .topk_window = 128, .topk_extra = 512, .empty_every = 1, .seed = 185},
             {.num_splits = 3, .wgmma = 1, .wgmma_ws = 1, .cluster_merge = 1}),
        Case({.batch = 48, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 186},
             {.wgmma = 1, .cluster_merge = 1})),
    [](const ::testing::TestParamInfo<GpuCase>& info) {
      std::string name = info.param.spec.Name();
      if (info.param.options.tile_rows) name += "_tile" + std::to_string(info.param.options.tile_rows);
      if (info.param.options.num_splits) name += "_split" + std::to_string(info.param.options.num_splits);
      if (info.param.options.warps) name += "_w" + std::to_string(info.param.options.warps);
      if (info.param.options.m_tiles) name += "_m" + std::to_string(info.param.options.m_tiles);
      if (info.param.options.pdl) name += "_pdl" + std::to_string(info.param.options.pdl);
      if (info.param.options.wgmma) name += info.param.options.wgmma == 1 ? "_wgmma" : "_mmasync";
      if (info.param.options.wgmma_ws) name += info.param.options.wgmma_ws == 1 ? "_ws" : "_twowg";
      if (info.param.options.cluster_merge) name += info.param.options.cluster_merge == 1 ? "_cluster" : "_combine";
      return name;
    });

TEST(GpuSparseMlaGraph, CapturedLaunchMatchesDirectLaunch) {
  DSV4_SKIP_WITHOUT_GPU();
  const ProblemSpec s{.batch = 4, .heads = 64, .topk_window = 128, .topk_extra = 512, .lengths = true, .seed = 201};
  const HostProblem host = MakeProblem(s);
  DeviceProblem dev(host);
  ASSERT_TRUE(dev.ok());
  // The wide kernel's combine without and with programmatic dependent launch, and the 8-warp kernel's.
  // And the cluster merge with both mma.sync kernels (wide: 16-head blocks, 8-warp: 64-head blocks) and both
  // wgmma kernels.
  for (const SparseMlaPlanOptions options :
       {SparseMlaPlanOptions{.pdl = -1, .cluster_merge = -1}, SparseMlaPlanOptions{.pdl = 1, .cluster_merge = -1},
        SparseMlaPlanOptions{.warps = 8, .cluster_merge = -1}, SparseMlaPlanOptions{.wgmma = 1},
        SparseMlaPlanOptions{.wgmma = 1, .wgmma_ws = -1}, SparseMlaPlanOptions{.cluster_merge = 1},
        SparseMlaPlanOptions{.warps = 8, .cluster_merge = 1}, SparseMlaPlanOptions{.wgmma = 1, .cluster_merge = 1},
        SparseMlaPlanOptions{.wgmma = 1, .wgmma_ws = -1, .cluster_merge = 1}}) {
    SCOPED_TRACE(::testing::Message() << "pdl " << options.pdl << ", warps " << options.warps << ", wgmma "
                                      << options.wgmma << ", wgmma_ws " << options.wgmma_ws << ", cluster_merge "
                                      << options.cluster_merge);
    if (options.wgmma == 1 && !WgmmaRuns()) continue;
    if (options.cluster_merge == 1 && ClusterMergeUnavailable(s, options)) continue;
    auto direct = RunKernel(dev, s, SparseMlaKernel::kMma, options);
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(direct->plan.cluster_merge, options.cluster_merge == 1);
    ASSERT_GT(direct->plan.num_splits, 1) << "the graph should hold the split and combine kernels";
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
    ASSERT_TRUE(dev.Poison());
    cudaGraph_t graph;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const absl::Status launched = LaunchSparseMlaDecode(dev.Params(), direct->plan, stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_TRUE(launched.ok()) << launched;
    cudaGraphExec_t exec;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<uint16_t> out;
    std::vector<float> lse;
    ASSERT_TRUE(dev.Download(out, lse));
    EXPECT_TRUE(out == direct->out);
    EXPECT_EQ(std::memcmp(lse.data(), direct->lse.data(), lse.size() * 4), 0);
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(stream);
  }
}

TEST(GpuSparseMlaLaunch, RejectsParamsThatDoNotFitThePlan) {
  DSV4_SKIP_WITHOUT_GPU();
  const ProblemSpec s{.batch = 4, .heads = 64, .topk_window = 16, .topk_extra = 16, .seed = 301};
  const HostProblem host = MakeProblem(s);
  DeviceProblem dev(host);
  ASSERT_TRUE(dev.ok());
  // The combine kernel's plan (the workspace check needs one; the cluster merge takes no workspace).
  auto plan = MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.num_splits = 2, .cluster_merge = -1});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->workspace_bytes, 0u);
  ASSERT_TRUE(dev.EnsureWorkspace(plan->workspace_bytes));
  ASSERT_TRUE(LaunchSparseMlaDecode(dev.Params(), *plan, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto expect_invalid = [&](SparseMlaParams p, const char* what) {
    const absl::Status st = LaunchSparseMlaDecode(p, *plan, nullptr);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what << ": " << st;
    EXPECT_NE(st.message().find(what), std::string::npos) << st.message();
  };
  SparseMlaParams p = dev.Params();
  p.num_heads = 16;
  expect_invalid(p, "num_heads");
  p = dev.Params();
  p.batch = 5;
  expect_invalid(p, "batch");
  p = dev.Params();
  p.workspace = nullptr;
  expect_invalid(p, "workspace");
  p = dev.Params();
  p.extra.cache += 8;
  expect_invalid(p, "aligned");
  p = dev.Params();
  p.num_heads = 48;
  expect_invalid(p, "num_heads");
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.tile_rows = 24}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.warps = 12}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.tile_rows = 16, .warps = 16}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.m_tiles = 3}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.pdl = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 16, 32, {.m_tiles = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.wgmma = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.wgmma_ws = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 16, 32, {.wgmma = 1}).status().code(),
            absl::StatusCode::kOk);  // 16 heads: no 64-head block
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 32, {.cluster_merge = 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // More splits than a cluster holds.
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kMma, 1, 64, 640, {.num_splits = 17, .cluster_merge = 1})
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  if (WgmmaRuns()) {  // the wgmma kernels merge in a cluster too (seventh pass)
    auto wgmma = MakeSparseMlaPlan(SparseMlaKernel::kMma, 4, 64, 640, {.num_splits = 2, .wgmma = 1,
                                                                        .cluster_merge = 1});
    ASSERT_TRUE(wgmma.ok()) << wgmma.status();
    EXPECT_TRUE(wgmma->wgmma && wgmma->cluster_merge);
    EXPECT_EQ(wgmma->workspace_bytes, 0u);
  }
}

// The two split merges give the same bits: the cluster merge uses the combine kernel's weights and order.
TEST(GpuSparseMlaClusterMerge, SameBitsAsTheCombineKernel) {
  DSV4_SKIP_WITHOUT_GPU();
  struct MergeCase {
    ProblemSpec spec;
    SparseMlaPlanOptions options;
  };
  const MergeCase cases[] = {
      {{.batch = 1, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 180},
       {.num_splits = 10, .m_tiles = 1}},
      {{.batch = 2, .heads = 16, .topk_window = 128, .topk_extra = 512, .lengths = true, .seed = 181},
       {.num_splits = 16, .warps = 16}},
      {{.batch = 8, .heads = 64, .topk_window = 64, .topk_extra = 448, .holes = 0.1, .empty_every = 5,
        .extreme = true, .seed = 182},
       {.num_splits = 7, .warps = 8}},
      {{.batch = 4, .heads = 128, .topk_window = 128, .topk_extra = 512, .lengths = true, .seed = 183},
       {.num_splits = 3, .warps = 8, .m_tiles = 4}},
      {{.batch = 4, .heads = 64, .topk_window = 128, .topk_extra = 512, .holes = 0.1, .seed = 187},
       {.num_splits = 4, .wgmma = 1, .wgmma_ws = 1}},
      {{.batch = 3, .heads = 128, .topk_window = 128, .topk_extra = 512, .lengths = true, .extreme = true,
        .seed = 188},
       {.num_splits = 2, .wgmma = 1, .wgmma_ws = -1}},
  };
  for (const MergeCase& c : cases) {
    SCOPED_TRACE(c.spec.Name());
    const HostProblem host = MakeProblem(c.spec);
    DeviceProblem dev(host);
    ASSERT_TRUE(dev.ok());
    SparseMlaPlanOptions with_cluster = c.options, with_kernel = c.options;
    with_cluster.cluster_merge = 1;
    with_kernel.cluster_merge = -1;
    if (ClusterMergeUnavailable(c.spec, with_cluster)) continue;
    if (c.options.wgmma == 1 && !WgmmaRuns()) continue;
    auto a = RunKernel(dev, c.spec, SparseMlaKernel::kMma, with_cluster);
    ASSERT_TRUE(a.ok()) << a.status();
    auto k = RunKernel(dev, c.spec, SparseMlaKernel::kMma, with_kernel);
    ASSERT_TRUE(k.ok()) << k.status();
    ASSERT_TRUE(a->plan.cluster_merge);
    ASSERT_FALSE(k->plan.cluster_merge);
    ASSERT_EQ(a->plan.num_splits, k->plan.num_splits);
    ASSERT_EQ(a->plan.wgmma_ws, k->plan.wgmma_ws);
    ASSERT_EQ(a->plan.wgmma, c.options.wgmma == 1);
    EXPECT_EQ(a->plan.workspace_bytes, 0u);
    size_t differ = 0;
    for (size_t i = 0; i < a->out.size(); ++i) differ += a->out[i] != k->out[i];
    EXPECT_EQ(differ, 0u) << "of " << a->out.size() << " outputs";
    EXPECT_EQ(std::memcmp(a->lse.data(), k->lse.data(), a->lse.size() * 4), 0);
  }
}

// The automatic plan's cluster merge (sm_90+): at most kMaxClusterSplits splits, every cluster of the batch
// resident at once, taken only where the combine plan's blocks hold one tile and the cluster's at most two or
// (kAutoClusterSameSplits) where it keeps the combine plan's split count, and no batch's critical path (tiles per
// split: one wave) longer than a larger batch's.
TEST(GpuSparseMlaPlan, ClusterMergeFitsOneWave) {
  DSV4_SKIP_WITHOUT_GPU();
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  if (major < 9) GTEST_SKIP() << "thread-block clusters need sm_90+";
  int clustered = 0;
  for (const int heads : {16, 64, 128}) {
    int prev_per_split = 1 << 30;
    for (int batch = 1; batch <= 128; ++batch) {
      SCOPED_TRACE(::testing::Message() << "H " << heads << " B " << batch);
      auto plan = MakeSparseMlaPlan(SparseMlaKernel::kMma, batch, heads, 640);
      ASSERT_TRUE(plan.ok()) << plan.status();
      if (!plan->cluster_merge) continue;
      ++clustered;
      EXPECT_GE(plan->num_splits, 2);
      EXPECT_LE(plan->num_splits, internal::kMaxClusterSplits);
      EXPECT_EQ(plan->workspace_bytes, 0u);
      const int64_t clusters = int64_t{batch} * plan->head_groups;
      const int capacity = plan->warps == 16 ? internal::MmaWideClusterCapacity(plan->m_tiles, plan->num_splits)
                           : plan->wgmma_ws  ? internal::MmaWgmmaWsClusterCapacity(plan->num_splits)
                           : plan->wgmma     ? internal::MmaWgmmaClusterCapacity(plan->num_splits)
                                             : internal::MmaClusterCapacity(plan->m_tiles, plan->tile_rows,
                                                                            plan->num_splits);
      EXPECT_GE(capacity, clusters);
      const int tiles = (640 + plan->tile_rows - 1) / plan->tile_rows;
      const int per_split = (tiles + plan->num_splits - 1) / plan->num_splits;
      auto combine = MakeSparseMlaPlan(SparseMlaKernel::kMma, batch, heads, 640, {.cluster_merge = -1});
      ASSERT_TRUE(combine.ok()) << combine.status();
      const int combine_per_split = (tiles + combine->num_splits - 1) / combine->num_splits;
      if (plan->num_splits == combine->num_splits) {
        // The same-splits rule: the same kernel and blocks as the combine plan, only the merge differs.
        EXPECT_EQ(plan->wgmma, combine->wgmma);
        EXPECT_EQ(plan->warps, combine->warps);
      } else {
        EXPECT_FALSE(plan->wgmma);
        EXPECT_EQ(combine_per_split, 1);
        EXPECT_LE(per_split, 2);
      }
      if (batch >= 10 && prev_per_split != 1 << 30) {
        EXPECT_GE(per_split, prev_per_split);
      }
      if (batch >= 10) prev_per_split = per_split;
    }
  }
  EXPECT_GT(clustered, 0) << "no batch merged in a cluster";
}

// The plan's split count at H = 16, 64 and 128 and every batch 1..128 with K = 640 (blocks run one per SM):
// where the batch's blocks fit one wave, the splits fill it without a second wave, no split count that keeps
// one wave gives fewer tiles per block, and no smaller one gives as few; a batch's critical path (waves x
// tiles per split) is never longer than the next larger batch's, so no bucket is slower than a bigger one by
// construction (compared from B = 10: up to B = 8 the plan uses smaller head groups).
TEST(GpuSparseMlaPlan, SplitsFillTheGpuAtEveryBatch) {
  DSV4_SKIP_WITHOUT_GPU();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  for (const int heads : {16, 64, 128}) {
    int64_t prev_path = 0;
    for (int batch = 1; batch <= 128; ++batch) {
      SCOPED_TRACE(::testing::Message() << "H " << heads << " B " << batch);
      auto plan = MakeSparseMlaPlan(SparseMlaKernel::kMma, batch, heads, 640, {.cluster_merge = -1});
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int tiles = (640 + plan->tile_rows - 1) / plan->tile_rows;
      const int64_t blocks = int64_t{batch} * plan->head_groups;
      const int splits = plan->num_splits;
      auto per_split = [&](int s) { return (tiles + s - 1) / s; };
      if (blocks <= sms) {
        EXPECT_LE(blocks * splits, sms);
        for (int s = 1; s <= tiles && blocks * s <= sms; ++s) {
          EXPECT_GE(per_split(s), per_split(splits)) << s << " splits";
          if (s < splits) {
            EXPECT_GT(per_split(s), per_split(splits)) << s << " splits";
          }
        }
      } else {
        EXPECT_EQ(splits, 1);
      }
      const int64_t path = (blocks * splits + sms - 1) / sms * per_split(splits);
      if (batch >= 10) {
        EXPECT_GE(path, prev_path);
      }
      prev_path = path;
    }
  }
}

// The kernels' dequantisation (DequantE4m3x4) against the host conversions of common/float_formats.h, bit
// for bit: all 256 e4m3 codes under all 256 ue8m0 scales (2^-127 .. 2^127: bf16 subnormal results, overflow
// to inf, scale byte 255 and e4m3 codes 0x7f / 0xff = NaN).
TEST(GpuSparseMlaDequant, AllCodesAllScalesBitExact) {
  DSV4_SKIP_WITHOUT_GPU();
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 65536 * sizeof(uint16_t)), cudaSuccess);
  DevicePtr guard(dev);
  ASSERT_EQ(cudaMemset(dev, 0xff, 65536 * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(internal::LaunchDequantTable(static_cast<uint16_t*>(dev), nullptr), cudaSuccess);
  std::vector<uint16_t> got(65536);
  ASSERT_EQ(cudaMemcpy(got.data(), dev, got.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost), cudaSuccess);
  int mismatches = 0, checked = 0;
  for (int s = 0; s < 256; ++s) {
    for (int c = 0; c < 256; ++c) {
      const float want = E4m3ToF32(static_cast<uint8_t>(c)) * Ue8m0ToF32(static_cast<uint8_t>(s));
      const uint16_t have = got[256 * s + c];
      const bool ok = std::isnan(want) ? std::isnan(Bf16ToF32(have)) : have == F32ToBf16(want);
      ++checked;
      if (!ok && ++mismatches <= 10) {
        ADD_FAILURE() << "scale byte " << s << ", e4m3 code 0x" << std::hex << c << ": got bf16 0x" << have
                      << ", want 0x" << F32ToBf16(want) << std::dec << " (" << want << ")";
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
  EXPECT_EQ(checked, 256 * 256);
}

TEST(SparseMlaLaunch, ParsesKernelNames) {
  EXPECT_EQ(*ParseSparseMlaKernel("mma"), SparseMlaKernel::kMma);
  EXPECT_EQ(*ParseSparseMlaKernel("simt"), SparseMlaKernel::kSimt);
  const absl::Status st = ParseSparseMlaKernel("fast").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("mma, simt"), std::string::npos);
  EXPECT_EQ(SparseMlaKernelName(SparseMlaKernel::kSimt), "simt");
  EXPECT_EQ(MakeSparseMlaPlan(SparseMlaKernel::kSimt, 8, 48, 640).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4::kernels::sparse_mla
