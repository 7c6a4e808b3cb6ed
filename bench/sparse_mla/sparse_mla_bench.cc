// sparse_mla_bench: times the MMA and SIMT sparse-MLA decode kernels as the engine runs them (CUDA graph
// replay of back-to-back attention launches), with input sets rotated so each replay reads far more than
// the L2. Per shape: median of --reps replays (after warm-up), achieved GB/s and TFLOP/s, the HBM floor
// (unique bytes over the measured device-to-device copy bandwidth) and the fraction of it reached, and the
// MMA/SIMT speedup, and the compute floor (FLOP over the measured mma.sync bf16 rate, mma_peak.cu) with the
// fraction of it reached. Prints a markdown table for bench/RESULTS.md.
//
//   sparse_mla_bench [--heads=64] [--batches=1,2,4,8,16,32,64,128] [--window=128] [--extra=512] [--reps=100]
//                    [--kernels=mma,simt] [--tile_rows=0] [--splits=0] [--warps=0] [--m_tiles=0] [--pdl=0] [--wgmma=0]
//                    [--wgmma_ws=0] [--cluster_merge=0]
//                    [--pool_mb=200] [--mma_peak=true]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/cuda_status.h"
#include "common/float_formats.h"
#include "bench/sparse_mla/mma_peak.h"
#include "kernels/sparse_mla/kv_row_format.h"
#include "kernels/sparse_mla/sparse_mla_launch.h"

ABSL_FLAG(int, heads, 64, "H: heads of the rank (16, 32, 64, 128)");
ABSL_FLAG(std::string, batches, "1,2,4,8,16,32,64,128", "comma-separated batch sizes");
ABSL_FLAG(int, window, 128, "selected window rows per sequence");
ABSL_FLAG(int, extra, 512, "selected compressed rows per sequence");
ABSL_FLAG(int, reps, 100, "timed graph replays per shape (median reported)");
ABSL_FLAG(std::string, kernels, "mma,simt", "kernels to time");
ABSL_FLAG(int, tile_rows, 0, "MMA tile rows override (0 = plan's choice)");
ABSL_FLAG(int, splits, 0, "MMA split override (0 = plan's choice)");
ABSL_FLAG(int, warps, 0, "MMA block width override: 16 (wide kernel) or 8 (0 = plan's choice)");
ABSL_FLAG(int, m_tiles, 0, "MMA 16-head m-tiles per block override: 1, 2 or 4 (0 = plan's choice)");
ABSL_FLAG(int, pdl, 0, "split combine with programmatic dependent launch: 1 on, -1 off (0 = plan's choice)");
ABSL_FLAG(int, wgmma, 0, "sm_90a wgmma kernel for 64-head blocks: 1 on, -1 off (0 = plan's choice)");
ABSL_FLAG(int, wgmma_ws, 0,
          "which wgmma kernel: 1 warp-specialised, -1 the two-warpgroup one (0 = plan's choice)");
ABSL_FLAG(int, cluster_merge, 0,
          "split merge in a thread-block cluster: 1 on, -1 off (the combine kernel) (0 = plan's choice)");
ABSL_FLAG(bool, mma_peak, true, "measure the mma.sync bf16 rate first (compute floor columns)");
ABSL_FLAG(int, pool_mb, 200, "KV pool size in MB (rows rotated through; keep well above the L2)");

namespace dsv4::kernels::sparse_mla {
namespace {

// A benchmark has no caller to return an error to: a failed CUDA call (common/cuda_status.h) ends the program.
void CheckCuda(cudaError_t err, const char* what) {
  const absl::Status s = CudaStatus(err, what);
  if (!s.ok()) {
    std::fprintf(stderr, "sparse_mla_bench: %s\n", s.ToString().c_str());
    std::exit(1);
  }
}
#define CHECK_CUDA(expr) CheckCuda((expr), #expr)

template <typename T>
T* DeviceAlloc(size_t count) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, std::max<size_t>(count, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy bandwidth (bytes read + written per second), the ceiling for the HBM floor.
double CopyBandwidth() {
  const size_t bytes = size_t{1} << 30;
  uint8_t* a = DeviceAlloc<uint8_t>(bytes);
  uint8_t* b = DeviceAlloc<uint8_t>(bytes);
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    CHECK_CUDA(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 3) t.push_back(ms * 1e-3);
  }
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * bytes / Median(t);
}

// A pool of random rows: e4m3 codes without NaN, scales 2^-8..2^-4, rope bf16 of magnitude ~1.
KvPoolView MakePool(int64_t rows, int page_rows) {
  const int64_t pages = (rows + page_rows - 1) / page_rows;
  const KvPoolView shape{nullptr, pages, page_rows};
  std::vector<uint8_t> host(shape.size_bytes());
  std::mt19937_64 rng(42);
  for (size_t i = 0; i < host.size(); i += 8) {
    const uint64_t r = rng();
    for (int j = 0; j < 8 && i + j < host.size(); ++j) host[i + j] = static_cast<uint8_t>(r >> (8 * j));
  }
  for (int64_t row = 0; row < shape.num_rows(); ++row) {
    uint8_t* data = host.data() + KvRowDataOffset(row, page_rows);
    uint8_t* scales = host.data() + KvRowScaleOffset(row, page_rows);
    for (int d = 0; d < kNopeDim; ++d) {
      if ((data[d] & 0x7f) == 0x7f) data[d] = 0x7e | (data[d] & 0x80);
    }
    for (int i = 0; i < kRopeDim; ++i) {
      const uint16_t h = F32ToBf16(static_cast<float>(static_cast<int>(data[kNopeDim + 2 * i]) - 128) / 64.0f);
      std::memcpy(data + kNopeDim + 2 * i, &h, 2);
    }
    for (int t = 0; t < kRowScaleBytes; ++t) scales[t] = static_cast<uint8_t>(119 + scales[t] % 5);
  }
  KvPoolView pool{DeviceAlloc<uint8_t>(host.size()), pages, page_rows};
  CHECK_CUDA(cudaMemcpy(pool.data, host.data(), host.size(), cudaMemcpyHostToDevice));
  return pool;
}

// One rotated input set: its own q, indices (disjoint rows of the pool), out and lse.
struct InputSet {
  uint16_t* q;
  int32_t* idx_w;
  int32_t* idx_e;
  uint16_t* out;
  float* lse;
};

std::vector<InputSet> MakeSets(int n_sets, int B, int H, int K_w, int K_e, int64_t pool_rows) {
  std::vector<InputSet> sets;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int K = K_w + K_e;
  for (int s = 0; s < n_sets; ++s) {
    InputSet set{DeviceAlloc<uint16_t>(size_t{1} * B * H * kKvDim), DeviceAlloc<int32_t>(size_t{1} * B * K_w),
                 DeviceAlloc<int32_t>(size_t{1} * B * K_e), DeviceAlloc<uint16_t>(size_t{1} * B * H * kKvDim),
                 DeviceAlloc<float>(size_t{1} * B * H)};
    std::vector<uint16_t> q(size_t{1} * B * H * kKvDim);
    for (uint16_t& x : q) x = F32ToBf16(normal(rng));
    CHECK_CUDA(cudaMemcpy(set.q, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    std::vector<int32_t> iw(size_t{1} * B * K_w), ie(size_t{1} * B * K_e);
    for (int b = 0; b < B; ++b) {
      // Each sequence owns K consecutive pool rows (whole pages, as a block table gives), visited in a
      // shuffled order (the indexer's picks are not sorted).
      std::vector<int32_t> rows(K);
      for (int j = 0; j < K; ++j) rows[j] = static_cast<int32_t>(((static_cast<int64_t>(s) * B + b) * K + j) % pool_rows);
      std::shuffle(rows.begin(), rows.end(), rng);
      std::copy(rows.begin(), rows.begin() + K_w, iw.begin() + static_cast<size_t>(b) * K_w);
      std::copy(rows.begin() + K_w, rows.end(), ie.begin() + static_cast<size_t>(b) * K_e);
    }
    CHECK_CUDA(cudaMemcpy(set.idx_w, iw.data(), iw.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(set.idx_e, ie.data(), ie.size() * 4, cudaMemcpyHostToDevice));
    sets.push_back(set);
  }
  return sets;
}

void FreeSets(std::vector<InputSet>& sets) {
  for (InputSet& s : sets) {
    for (void* p : {static_cast<void*>(s.q), static_cast<void*>(s.idx_w), static_cast<void*>(s.idx_e),
                    static_cast<void*>(s.out), static_cast<void*>(s.lse)}) {
      CHECK_CUDA(cudaFree(p));
    }
  }
  sets.clear();
}

SparseMlaParams SetParams(const InputSet& s, const KvPoolView& pool, int B, int H, int K_w, int K_e, void* ws,
                          size_t ws_bytes) {
  return SparseMlaParams{
      .batch = B,
      .num_heads = H,
      .q = s.q,
      .window = {.cache = pool.data, .num_pages = pool.num_pages, .page_rows = pool.page_rows, .indices = s.idx_w,
                 .topk = K_w, .index_stride = K_w},
      .extra = {.cache = K_e ? pool.data : nullptr, .num_pages = pool.num_pages, .page_rows = pool.page_rows,
                .indices = K_e ? s.idx_e : nullptr, .topk = K_e, .index_stride = K_e},
      .attn_sink = nullptr,
      .softmax_scale = 1.0f / std::sqrt(512.0f),
      .out = s.out,
      .lse = s.lse,
      .workspace = ws,
      .workspace_bytes = ws_bytes,
  };
}

// Median seconds per attention launch: one graph holds one launch per input set, replayed `reps` times.
double TimeKernel(SparseMlaKernel kernel, const std::vector<InputSet>& sets, const KvPoolView& pool, int B, int H,
                  int K_w, int K_e, int reps, SparseMlaPlan* plan_out) {
  SparseMlaPlanOptions options{.tile_rows = absl::GetFlag(FLAGS_tile_rows),
                               .num_splits = absl::GetFlag(FLAGS_splits),
                               .warps = absl::GetFlag(FLAGS_warps),
                               .m_tiles = absl::GetFlag(FLAGS_m_tiles),
                               .pdl = absl::GetFlag(FLAGS_pdl),
                               .wgmma = absl::GetFlag(FLAGS_wgmma),
                               .wgmma_ws = absl::GetFlag(FLAGS_wgmma_ws),
                               .cluster_merge = absl::GetFlag(FLAGS_cluster_merge)};
  auto plan = MakeSparseMlaPlan(kernel, B, H, K_w + K_e, options);
  if (!plan.ok()) {
    std::fprintf(stderr, "plan: %s\n", plan.status().ToString().c_str());
    std::exit(1);
  }
  *plan_out = *plan;
  void* ws = plan->workspace_bytes ? DeviceAlloc<uint8_t>(plan->workspace_bytes) : nullptr;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  CHECK_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (const InputSet& s : sets) {
    const absl::Status st = LaunchSparseMlaDecode(SetParams(s, pool, B, H, K_w, K_e, ws, plan->workspace_bytes),
                                                  *plan, stream);
    if (!st.ok()) {
      std::fprintf(stderr, "launch: %s\n", st.ToString().c_str());
      std::exit(1);
    }
  }
  CHECK_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CHECK_CUDA(cudaGraphLaunch(exec, stream));
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(e0, stream));
    CHECK_CUDA(cudaGraphLaunch(exec, stream));
    CHECK_CUDA(cudaEventRecord(e1, stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms * 1e-3 / static_cast<double>(sets.size()));
  }
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaGraphExecDestroy(exec));
  CHECK_CUDA(cudaGraphDestroy(graph));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  if (ws) CHECK_CUDA(cudaFree(ws));
  return Median(t);
}

// Relative difference by norm between the two kernels' outputs on set 0 (a cheap sanity check that the
// timed kernels compute the same thing; the tests compare both with the float64 reference).
double OutputDiff(const InputSet& s, const std::vector<uint16_t>& other, size_t n) {
  std::vector<uint16_t> mine(n);
  CHECK_CUDA(cudaMemcpy(mine.data(), s.out, n * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double a = Bf16ToF32(mine[i]), b = Bf16ToF32(other[i]);
    num += (a - b) * (a - b);
    den += b * b;
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

int Main() {
  const int H = absl::GetFlag(FLAGS_heads), K_w = absl::GetFlag(FLAGS_window), K_e = absl::GetFlag(FLAGS_extra);
  const int K = K_w + K_e, reps = std::max(absl::GetFlag(FLAGS_reps), 1);
  std::vector<int> batches;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    int b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1) {
      std::fprintf(stderr, "bad --batches entry '%s'\n", std::string(part).c_str());
      return 2;
    }
    batches.push_back(b);
  }
  const std::string kernels = absl::GetFlag(FLAGS_kernels);
  const bool run_mma = kernels.find("mma") != std::string::npos, run_simt = kernels.find("simt") != std::string::npos;

  int device = 0;
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  const double copy_bw = CopyBandwidth();
  std::printf("GPU: %s, %d SMs, L2 %d MB; device-to-device copy %.0f GB/s (read + write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_bw * 1e-9);
  const double mma_peak = absl::GetFlag(FLAGS_mma_peak) ? MeasureMmaSyncPeak(/*verbose=*/true) : 0.0;
  if (mma_peak > 0) std::printf("mma.sync bf16 ceiling: %.0f TFLOP/s\n", mma_peak * 1e-12);
  const int64_t pool_rows = static_cast<int64_t>(absl::GetFlag(FLAGS_pool_mb)) * 1000000 / kRowBytes;
  const KvPoolView pool = MakePool(pool_rows, 64);
  std::printf("H=%d, K=%d (%d window + %d compressed), pool %.0f MB, reps %d\n\n", H, K, K_w, K_e,
              pool.size_bytes() * 1e-6, reps);
  std::printf("| B | sets | warps | m-tiles | splits | merge | pdl | wgmma | MMA us | SIMT us | MMA/SIMT | MMA GB/s | MMA TFLOP/s | "
              "HBM floor us | HBM floor/MMA | mma floor us | mma floor/MMA | check |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const int B : batches) {
    const int n_sets = static_cast<int>(std::clamp<int64_t>(pool.num_rows() / (int64_t{B} * K), 1, 512));
    std::vector<InputSet> sets = MakeSets(n_sets, B, H, K_w, K_e, pool.num_rows());
    const double bytes = double{1} * B * H * kKvDim * 2 * 2 + double{1} * B * K * (kRowBytes + 4) + double{1} * B * H * 4;
    const double flops = 4.0 * B * H * K * kKvDim;
    SparseMlaPlan mma_plan, simt_plan;
    double t_mma = 0, t_simt = 0, diff = -1;
    std::vector<uint16_t> simt_out;
    const size_t n_out = size_t{1} * B * H * kKvDim;
    if (run_simt) {
      t_simt = TimeKernel(SparseMlaKernel::kSimt, sets, pool, B, H, K_w, K_e, reps, &simt_plan);
      simt_out.resize(n_out);
      CHECK_CUDA(cudaMemcpy(simt_out.data(), sets[0].out, n_out * 2, cudaMemcpyDeviceToHost));
    }
    if (run_mma) {
      t_mma = TimeKernel(SparseMlaKernel::kMma, sets, pool, B, H, K_w, K_e, reps, &mma_plan);
      if (run_simt) diff = OutputDiff(sets[0], simt_out, n_out);
    }
    const double floor = bytes / copy_bw;
    const double mma_floor = mma_peak > 0 ? flops / mma_peak : 0.0;
    std::printf("| %d | %d | %d | %d | %d | %s | %d | %d | %.2f | %.2f | %.1fx | %.0f | %.1f | %.2f | %.0f%% | %.2f | %.0f%% | %.1e |\n",
                B, n_sets, mma_plan.warps, mma_plan.m_tiles, mma_plan.num_splits,
                mma_plan.num_splits < 2 ? "-" : mma_plan.cluster_merge ? "cluster" : "kernel", mma_plan.pdl ? 1 : 0,
                mma_plan.wgmma_ws ? 2 : mma_plan.wgmma ? 1 : 0, t_mma * 1e6, t_simt * 1e6,
                t_mma > 0 ? t_simt / t_mma : 0.0, t_mma > 0 ? bytes / t_mma * 1e-9 : 0.0,
                t_mma > 0 ? flops / t_mma * 1e-12 : 0.0, floor * 1e6, t_mma > 0 ? 100.0 * floor / t_mma : 0.0,
                mma_floor * 1e6, t_mma > 0 ? 100.0 * mma_floor / t_mma : 0.0, diff);
    std::fflush(stdout);
    FreeSets(sets);
  }
  std::printf("\nbytes = q + out (bf16) + selected rows (584 B + 4 B index each) + lse; HBM floor = bytes / copy "
              "bandwidth; mma floor = 4 B H K 512 FLOP / mma.sync ceiling; warps 16 = wide kernel (32-row tiles), "
              "8 = 8-warp kernel; merge = how splits merge (cluster: in a thread-block cluster, kernel: the combine kernel); wgmma 1 = the two-warpgroup wgmma kernel, 2 = the warp-specialised one; check = |out_mma - out_simt| / |out_simt| on set 0\n");
  return 0;
}

}  // namespace
}  // namespace dsv4::kernels::sparse_mla

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dsv4::kernels::sparse_mla::Main();
}
