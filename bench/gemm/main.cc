// dsv4-gemm-bench: the CUDA backend's FP8 block-128 / BF16 linear at the real shapes of configs/flash.json (TP 1
// and the TP-4 shard; a shape both share runs once under all its names) for M = T tokens, against its peers in the
// same run: cuBLASLt's block-scaled FP8 GEMM (weights BLK128x128_32F, activations quantised to e4m3 with
// VEC128_32F scales) and cuBLASLt bf16 on the weights dequantised to bf16 (issue 14). Per shape and T it prints
// the median of --reps CUDA-graph replays (weights rotated through more memory than the L2, each set a copy of
// the same weight), GB/s and % of the device-to-device copy bandwidth measured in the same run for the op's floor
// bytes (the weight as stored + x f32 + y f32, the same for every column), the time over that floor, and the
// relative error (by norm, over the first --ref_tokens tokens) against the CPU backend's Linear on the same
// inputs. --variants also times the other kernels (FP8: the weight ring, the split-K kernel's register ring and
// the tiled kernel, each with its own plan; ring depths and half / double splits; the multi-weight kernel's builds
// on the one weight) beside the automatic one (the data the planner's choices rest on); --once launches plans once
// each for a profiler. --groups times the projection groups model/dsv4 fuses (separate linears vs one
// FusedLinear). docs/cuda-backend.md
// ("The linear's speed") and bench/RESULTS.md have the results.
//
//   dsv4-gemm-bench --config=configs/flash.json            TP 1 and TP 4, T = 1 .. 128, peers and variants
//   dsv4-gemm-bench --plans                                the automatic plans only (no GPU needed)
//   dsv4-gemm-bench --only=wq_b,wo_b --tokens=1,32 --variants=false
// Exit status: 0 when every case of the backend's kernel ran and matched the CPU reference, 1 otherwise.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/gemm/lt_peer.h"
#include "bench/ops/flag_lists.h"
#include "bench/ops/runner.h"
#include "bench/ops/synth.h"
#include "common/float_formats.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/linear.h"
#include "model/config/config.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, config, "", "config.json of the model (empty: configs/flash.json's values)");
ABSL_FLAG(std::string, tp, "1,4", "tensor-parallel worlds whose rank shapes run");
ABSL_FLAG(std::string, tokens, "1,2,4,8,16,32,64,128", "M: tokens per call");
ABSL_FLAG(std::string, only, "",
          "comma-separated shape names (a shape runs when one of its names is listed; a group when its name "
          "contains one of them, e.g. ratio-4)");
ABSL_FLAG(int, reps, 50, "timed replays per case (median reported)");
ABSL_FLAG(double, rotate_mb, 256, "weight bytes cycled per replay (sets of copies of the weight)");
ABSL_FLAG(double, replay_budget_ms, 25, "sets are capped so that one replay takes about this long");
ABSL_FLAG(double, warmup_ms, 10, "untimed replays before each case's timed ones (at least 3)");
ABSL_FLAG(bool, variants, true, "also time the tiled kernel and split-K plans beside the automatic one");
ABSL_FLAG(bool, peers, true, "also time cuBLASLt: block-scaled FP8 and bf16 on dequantised weights");
ABSL_FLAG(bool, fused, true, "also the fused shapes a later change could launch (wq_a+wkv, shared w1+w3)");
ABSL_FLAG(bool, groups, true,
          "also the projection groups model/dsv4 fuses (ModelOptions::fuse_projections): separate linears vs one "
          "FusedLinear per build (default / lean, hardware / bit-move FP8 dequantisation)");
ABSL_FLAG(bool, singles, true, "the single-weight shapes (false: only the groups)");
ABSL_FLAG(int, ref_tokens, 8, "tokens compared with the CPU reference");
ABSL_FLAG(int, threads, 0, "CPU reference threads (0: every core)");
ABSL_FLAG(bool, plans, false, "print the automatic plan of every shape and T for --sms SMs and exit (no GPU)");
ABSL_FLAG(int, sms, 132, "SMs assumed by --plans");
ABSL_FLAG(std::string, json, "dsv4_gemm_bench.json", "JSON file of every result (empty: none)");
ABSL_FLAG(std::string, tag, "", "free text recorded in the JSON file (e.g. the commit)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the synthetic weights and inputs");
ABSL_FLAG(std::string, once, "",
          "for a profiler (ncu): launch each listed plan (auto, ring, reg, tiled, wgmma) once per shape and T, eagerly, "
          "with no timing, reference or peers, printing one line per launch in order, and exit");

namespace dsv4::bench {
namespace {

using kernels::Backend;
using kernels::Buffer;
using kernels::DType;
using kernels::LinearArgs;
using kernels::LinearHandle;
using kernels::MemoryKind;
using kernels::WeightFormat;
using kernels::cuda::CudaBackend;
using kernels::cuda::CudaLinearWeight;
using kernels::cuda::LinearPlan;

constexpr double kOurMaxRel = 1e-2;  // raw f32 x rounded to bf16: ~2e-3 expected

struct Shape {
  std::vector<std::string> names;
  WeightFormat format = WeightFormat::kFp8Block128;
  int64_t n = 0, k = 0;  // per group
  int groups = 1;
};

// The flag's list; a bad item ends the program (exit 2).
std::vector<int64_t> ParseList(const std::string& flag, const std::string& text) {
  absl::StatusOr<std::vector<int64_t>> list = ParsePositiveList(flag, text);
  if (!list.ok()) {
    std::fprintf(stderr, "%s\n", std::string(list.status().message()).c_str());
    std::exit(2);
  }
  return *std::move(list);
}

// The linears of one layer for each TP world's rank (as dsv4-ops-bench names them), deduplicated by shape.
std::vector<Shape> MakeShapes(const Config& c, const std::vector<int64_t>& tps, bool fused) {
  std::vector<Shape> out;
  const WeightFormat fp8 = WeightFormat::kFp8Block128, bf16 = WeightFormat::kBF16;
  auto add = [&](const std::string& name, WeightFormat f, int64_t n, int64_t k, int64_t groups) {
    for (Shape& s : out) {
      if (s.format == f && s.n == n && s.k == k && s.groups == groups) {
        s.names.push_back(name);
        return;
      }
    }
    out.push_back({.names = {name}, .format = f, .n = n, .k = k, .groups = static_cast<int>(groups)});
  };
  for (const int64_t tp : tps) {
    const std::string sfx = tp == 1 ? "" : absl::StrCat(" tp", tp);
    const int64_t heads = c.num_attention_heads / tp;
    const int64_t groups = std::max<int64_t>(1, c.o_groups * heads / c.num_attention_heads);
    const int64_t group_in = heads / groups * c.head_dim;
    const int64_t shared = c.moe_intermediate_size * c.n_shared_experts / tp;
    add("wq_a" + sfx, fp8, c.q_lora_rank, c.hidden_size, 1);
    add("wq_b" + sfx, fp8, heads * c.head_dim, c.q_lora_rank, 1);
    add("wkv" + sfx, fp8, c.head_dim, c.hidden_size, 1);
    add("wo_a" + sfx, fp8, c.o_lora_rank, group_in, groups);
    add("wo_b" + sfx, fp8, c.hidden_size, groups * c.o_lora_rank, 1);
    add("indexer.wq_b" + sfx, fp8, c.index_n_heads * c.index_head_dim, c.q_lora_rank, 1);
    add("shared.w1|w3" + sfx, fp8, shared, c.hidden_size, 1);
    add("shared.w2" + sfx, fp8, c.hidden_size, shared, 1);
    add("compressor_r4.wkv|wgate" + sfx, bf16, 2 * c.head_dim, c.hidden_size, 1);
    add("compressor_r128.wkv|wgate" + sfx, bf16, c.head_dim, c.hidden_size, 1);
    add("indexer.weights_proj" + sfx, bf16, c.index_n_heads, c.hidden_size, 1);
    add("indexer.compressor.wkv|wgate" + sfx, bf16, 2 * c.index_head_dim, c.hidden_size, 1);
    if (fused) {
      add("fused wq_a+wkv" + sfx, fp8, c.q_lora_rank + c.head_dim, c.hidden_size, 1);
      add("fused shared.w1+w3" + sfx, fp8, 2 * shared, c.hidden_size, 1);
    }
  }
  return out;
}

std::string ShapeName(const Shape& s) {
  return absl::StrFormat("%s [%d, %d]%s", kernels::WeightFormatName(s.format), s.n, s.k,
                         s.groups > 1 ? absl::StrFormat(" x %d groups", s.groups) : std::string());
}

kernels::cuda::LinearKernelFormat KernelFormat(const Shape& s) {
  return s.format == WeightFormat::kBF16 ? kernels::cuda::LinearKernelFormat::kBf16
                                         : kernels::cuda::LinearKernelFormat::kFp8;
}

double WeightBytes(const Shape& s) {
  const int64_t rows = s.n * s.groups;
  if (s.format == WeightFormat::kBF16) return 2.0 * rows * s.k;
  return 1.0 * rows * s.k + 4.0 * ((rows + 127) / 128) * ((s.k + 127) / 128);
}

// Relative error by norm and max abs error of got vs want (NaN / inf: non_finite).
struct Err {
  double rel = -1, max_abs = 0;
  bool non_finite = false;
};
Err Compare(const std::vector<float>& got, const std::vector<float>& want) {
  Err e;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (!std::isfinite(got[i])) {
      e.non_finite = true;
      continue;
    }
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
  }
  e.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

std::string Now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// One timed column of a (shape, T) row.
struct Cell {
  std::string what{};  // "ours", "ring", "reg", "tiled", "st2", "m2", "s/2", "s*2", "lt_fp8", "lt_bf16"
  std::string plan{};  // the linear plan or the peer's note
  Result r{};
  Err err{};
  bool ran = false;
};

struct Ctx {
  Backend& cuda;
  CudaBackend& gpu;
  Backend& cpu;
  Runner& runner;
  CublasLt* lt = nullptr;       // null: peers unavailable
  std::string lt_missing{};     // why
  double copy_bps = 0;
  int sms = 132;
  std::vector<int64_t> tokens{};
  int64_t max_t = 1, x_rows = 4;  // x buffers hold x_rows >= max(max_t, 4) tokens
  int ref_tokens = 8;
  double rotate_bytes = 256e6;
  bool variants = true;
  int vec128_layout = -1;  // cuBLASLt activation scales: 0 [blocks][tokens], 1 [tokens][blocks]; -1 not chosen
  uint64_t seed = 1;
  nlohmann::json json = nlohmann::json::array();
  int failures = 0;
};

int SetsFor(const Ctx& ctx, double bytes) {
  return static_cast<int>(std::clamp<double>(std::ceil(ctx.rotate_bytes / std::max(bytes, 1.0)), 1.0, 2048.0));
}

// x [x_rows, groups * k]: N(0, 1) times a factor 2^(-2..2) per (token, 128-block), so activation scales differ
// across tokens and blocks (a wrong scale layout shows in the peer's error).
std::vector<float> MakeX(const Ctx& ctx, int64_t cols, uint64_t seed) {
  std::vector<float> x = RandomFloats(ctx.x_rows * cols, seed);
  for (int64_t t = 0; t < ctx.x_rows; ++t) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t e = (t * 7 + (c / 128) * 3) % 5 - 2;
      x[static_cast<size_t>(t * cols + c)] *= std::ldexp(1.f, static_cast<int>(e));
    }
  }
  return x;
}

template <typename T>
Buffer Upload(Backend& b, const std::vector<T>& host) {
  absl::StatusOr<Buffer> buf = UploadVector(b, host);
  if (!buf.ok()) {
    std::fprintf(stderr, "upload: %s\n", buf.status().ToString().c_str());
    std::exit(3);
  }
  return *std::move(buf);
}

// Downloads rows [0, rows) of a [*, cols] f32 or bf16 device matrix as floats.
std::vector<float> DownloadRows(Backend& b, const void* p, int64_t rows, int64_t cols, bool bf16) {
  std::vector<float> out;
  if (bf16) {
    absl::StatusOr<std::vector<uint16_t>> h = DownloadVector<uint16_t>(b, p, rows * cols);
    if (!h.ok()) return out;
    out.resize(h->size());
    for (size_t i = 0; i < h->size(); ++i) out[i] = Bf16ToF32((*h)[i]);
  } else {
    absl::StatusOr<std::vector<float>> h = DownloadVector<float>(b, p, rows * cols);
    if (h.ok()) out = *std::move(h);
  }
  return out;
}

void RunShape(Ctx& ctx, const Shape& sh) {
  const auto t_shape = std::chrono::steady_clock::now();
  const int64_t G = sh.groups, N = sh.n, K = sh.k, NT = G * N, KT = G * K;
  const bool fp8 = sh.format == WeightFormat::kFp8Block128;
  const std::string name = absl::StrJoin(sh.names, " = ");
  const std::string shape = ShapeName(sh);
  const double wbytes = WeightBytes(sh);
  std::printf("\n### %s: %s, %.2f MB\n\n", name.c_str(), shape.c_str(), wbytes / 1e6);
  std::fflush(stdout);

  const HostLinear host = SynthLinear("bench." + sh.names[0], sh.format, NT, K, ctx.seed += 101);
  const std::vector<float> x = MakeX(ctx, KT, ctx.seed + 1);

  // CPU reference on the first R tokens (x rows are shared by every T, so one reference serves all).
  const int64_t R = std::min<int64_t>(ctx.ref_tokens, ctx.max_t);
  std::vector<float> ref;
  {
    absl::StatusOr<LinearHandle> w = ctx.cpu.PrepareLinear(host.view);
    if (!w.ok()) {
      std::printf("CPU reference: %s\n", w.status().ToString().c_str());
      ++ctx.failures;
      return;
    }
    const std::vector<float> xr(x.begin(), x.begin() + R * KT);
    Buffer xb = Upload(ctx.cpu, xr);
    absl::StatusOr<Buffer> yb = ctx.cpu.Allocate(R * NT * 4, MemoryKind::kWorkspace);
    if (!yb.ok()) std::exit(3);
    ctx.cpu.ops().Linear({.w = w->get(), .x = {.data = xb.data(), .dtype = DType::kF32}, .y = yb->as<float>(),
                          .t = R, .groups = static_cast<int>(G)});
    if (absl::Status s = ctx.cpu.Synchronize(); !s.ok()) std::exit(3);
    ref = DownloadRows(ctx.cpu, yb->data(), R, NT, false);
  }

  // The backend's weight, copied until a replay cycles through rotate_mb.
  std::vector<LinearHandle> copies;
  const int sets = SetsFor(ctx, wbytes);
  for (int i = 0; i < sets; ++i) {
    absl::StatusOr<LinearHandle> w = ctx.cuda.PrepareLinear(host.view);
    if (!w.ok()) {
      std::printf("PrepareLinear: %s\n", w.status().ToString().c_str());
      ++ctx.failures;
      return;
    }
    copies.push_back(*std::move(w));
  }
  Buffer xg = Upload(ctx.cuda, x);
  absl::StatusOr<Buffer> yg = ctx.cuda.Allocate(ctx.x_rows * NT * 4, MemoryKind::kWorkspace);
  if (!yg.ok()) std::exit(3);

  // Peers' inputs: x as e4m3 codes with per (token, 128-block) scales, x as bf16; weights dequantised to bf16.
  const int64_t L = (K + 127) / 128;
  std::vector<uint8_t> xq(static_cast<size_t>(ctx.x_rows * KT));
  std::vector<float> xs(static_cast<size_t>(ctx.x_rows * G * L));  // [t][g*L + b]
  std::vector<uint16_t> x16(x.size());
  for (int64_t t = 0; t < ctx.x_rows; ++t) {
    for (int64_t b = 0; b < G * L; ++b) {
      const int64_t c0 = (b / L) * K + (b % L) * 128, c1 = std::min((b / L) * K + (b % L + 1) * 128, (b / L + 1) * K);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[static_cast<size_t>(t * KT + c)]));
      const float s = amax > 0 ? amax / 448.f : 1.f;
      xs[static_cast<size_t>(t * G * L + b)] = s;
      for (int64_t c = c0; c < c1; ++c) xq[static_cast<size_t>(t * KT + c)] = F32ToE4m3(x[static_cast<size_t>(t * KT + c)] / s);
    }
  }
  for (size_t i = 0; i < x.size(); ++i) x16[i] = F32ToBf16(x[i]);
  const bool peers = ctx.lt != nullptr;
  Buffer xqg, x16g, yq, y16;
  std::vector<Buffer> w16;  // bf16 weight copies
  if (peers) {
    if (fp8) xqg = Upload(ctx.cuda, xq);
    x16g = Upload(ctx.cuda, x16);
    absl::StatusOr<Buffer> a = ctx.cuda.Allocate(ctx.x_rows * NT * 4, MemoryKind::kWorkspace);
    absl::StatusOr<Buffer> b = ctx.cuda.Allocate(ctx.x_rows * NT * 4, MemoryKind::kWorkspace);
    if (!a.ok() || !b.ok()) std::exit(3);
    yq = *std::move(a);
    y16 = *std::move(b);
    std::vector<uint16_t> wb(static_cast<size_t>(NT * K));
    if (fp8) {
      for (int64_t r = 0; r < NT; ++r) {
        for (int64_t c = 0; c < K; ++c) {
          const size_t si = static_cast<size_t>((r / 128) * L + c / 128);
          float scale = 0;
          if (host.view.scale_f32) {
            std::memcpy(&scale, host.view.scale + 4 * si, 4);
          } else {
            scale = Ue8m0ToF32(host.view.scale[si]);
          }
          wb[static_cast<size_t>(r * K + c)] = F32ToBf16(E4m3ToF32(host.view.data[r * K + c]) * scale);
        }
      }
    } else {
      std::memcpy(wb.data(), host.view.data, wb.size() * 2);
    }
    const int sets16 = SetsFor(ctx, 2.0 * NT * K);
    for (int i = 0; i < sets16; ++i) w16.push_back(Upload(ctx.cuda, wb));
  }

  // Activation scales of group g for a call of m tokens, in layout 0 ([blocks][tokens]) or 1 ([tokens][blocks]).
  auto x_scales = [&](int layout, int64_t g, int64_t m) {
    std::vector<float> out(static_cast<size_t>(L * m));
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t b = 0; b < L; ++b) {
        const float s = xs[static_cast<size_t>(t * G * L + g * L + b)];
        out[static_cast<size_t>(layout == 0 ? b * m + t : t * L + b)] = s;
      }
    }
    return out;
  };

  // cuBLASLt FP8 for m tokens (padded to a multiple of 4, at least 4): one product per group.
  struct LtCall {
    std::vector<std::shared_ptr<CublasLt::Gemm>> gemms;
    std::vector<Buffer> scales;
    int64_t m = 0;
    std::string note;
    absl::Status status;
  };
  auto prepare_lt_fp8 = [&](int64_t t, int layout) {
    LtCall call;
    call.m = std::max<int64_t>(4, (t + 3) / 4 * 4);
    if (t != call.m) call.note = absl::StrCat("M padded to ", call.m);
    const auto* w0 = static_cast<const CudaLinearWeight*>(copies[0].get());
    for (int64_t g = 0; g < G; ++g) {
      call.scales.push_back(Upload(ctx.cuda, x_scales(layout, g, call.m)));
      // The weight scales of group g: block rows g*N/128 .. (N % 128 == 0 at every shape here).
      absl::StatusOr<std::shared_ptr<CublasLt::Gemm>> gm =
          ctx.lt->PrepareFp8(N, call.m, K, K, KT, NT, w0->scale() + g * (N / 128) * L, call.scales.back().as<float>());
      if (!gm.ok()) {
        call.status = gm.status();
        return call;
      }
      call.gemms.push_back(*std::move(gm));
    }
    return call;
  };
  auto enqueue_lt_fp8 = [&ctx, &copies, &xqg, &yq, G, N, K](const LtCall& call, int s) {
    const auto* w = static_cast<const CudaLinearWeight*>(copies[static_cast<size_t>(s)].get());
    const size_t d_esize = call.gemms[0]->d_type == CUDA_R_32F ? 4 : 2;
    for (int64_t g = 0; g < G; ++g) {
      (void)ctx.lt->Run(*call.gemms[static_cast<size_t>(g)], static_cast<const uint8_t*>(w->data()) + g * N * K,
                        xqg.as<const uint8_t>() + g * K, static_cast<uint8_t*>(yq.data()) + g * N * d_esize,
                        ctx.gpu.stream());
    }
  };

  // Choose the activation-scale layout once (the one whose product matches the reference).
  if (peers && fp8 && ctx.vec128_layout < 0 && N % 128 == 0) {
    const int64_t tprobe = std::min<int64_t>(8, ctx.x_rows);
    double errs[2] = {-1, -1};
    for (int layout = 0; layout < 2; ++layout) {
      LtCall call = prepare_lt_fp8(tprobe, layout);
      if (!call.status.ok()) continue;
      enqueue_lt_fp8(call, 0);
      if (!ctx.cuda.Synchronize().ok()) continue;
      const int64_t rows = std::min(tprobe, R);
      const std::vector<float> got = DownloadRows(ctx.cuda, yq.data(), rows, NT, call.gemms[0]->d_type != CUDA_R_32F);
      errs[layout] = Compare(got, std::vector<float>(ref.begin(), ref.begin() + rows * NT)).rel;
    }
    if (errs[0] >= 0 || errs[1] >= 0) {
      ctx.vec128_layout = (errs[1] >= 0 && (errs[0] < 0 || errs[1] < errs[0])) ? 1 : 0;
      std::printf("cuBLASLt VEC128 activation scales: [blocks][tokens] rel err %.3g, [tokens][blocks] rel err %.3g "
                  "-> using %s\n\n",
                  errs[0], errs[1], ctx.vec128_layout == 0 ? "[blocks][tokens]" : "[tokens][blocks]");
    }
  }

  std::printf("| T | ours us | GB/s | %% copy | x floor | rel err | plan | others (us) | cuBLASLt FP8 us | %% copy | "
              "rel err | cuBLASLt bf16 us | %% copy | rel err | fastest |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);

  for (const int64_t t : ctx.tokens) {
    const double floor_bytes = wbytes + 4.0 * t * KT + 4.0 * t * NT;
    const double floor_us = floor_bytes / ctx.copy_bps * 1e6;
    const int64_t rows = std::min(t, R);
    const std::vector<float> want(ref.begin(), ref.begin() + rows * NT);
    const LinearArgs base{.w = copies[0].get(), .x = {.data = xg.data(), .dtype = DType::kF32},
                          .y = yg->as<float>(), .t = t, .groups = static_cast<int>(G)};
    std::vector<Cell> cells;

    // Times one column: enqueue(s) for set s; y / its dtype checked against the reference.
    auto time = [&](Cell cell, int max_sets, double rotated, std::function<void(int)> enqueue, void* y, bool y_bf16,
                    bool strict) {
      Case c{.family = "gemm", .op = cell.what, .shape = absl::StrFormat("%s T=%d", shape, t),
             .params = {{"names", sh.names}, {"format", kernels::WeightFormatName(sh.format)}, {"n", N}, {"k", K},
                        {"groups", G}, {"t", t}, {"plan", cell.plan}},
             .max_sets = max_sets, .rotated_bytes_per_set = rotated, .enqueue = std::move(enqueue),
             .bytes = [floor_bytes](int) { return floor_bytes; },
             .prepare = [&ctx, y, NT]() {
               // NaN in every y element (f32 view): an element a kernel forgets to write fails.
               ctx.cuda.ops().Fill({.x = static_cast<float*>(y), .n = ctx.x_rows * NT,
                                    .value = std::numeric_limits<float>::quiet_NaN()});
               return ctx.cuda.Synchronize();
             },
             .check = [&ctx, &cell, &want, y, y_bf16, rows, NT, strict]() -> absl::Status {
               const std::vector<float> got = DownloadRows(ctx.cuda, y, rows, NT, y_bf16);
               cell.err = Compare(got, want);
               if (cell.err.non_finite) return absl::DataLossError("non-finite output");
               if (strict && cell.err.rel > kOurMaxRel) {
                 return absl::DataLossError(absl::StrFormat("rel err %.3g above %.0e", cell.err.rel, kOurMaxRel));
               }
               return absl::OkStatus();
             }};
      cell.r = ctx.runner.Run(ctx.cuda, c);
      cell.ran = true;
      if (strict && !cell.r.ok) ++ctx.failures;
      cells.push_back(cell);
      return cells.size() - 1;
    };

    // The backend's linear as the engine calls it.
    const LinearPlan auto_plan = kernels::cuda::AutoLinearPlan(t, N, K, static_cast<int>(G), ctx.sms, KernelFormat(sh));
    // On sm_90a from kWgmmaMinTokens the launch takes the wgmma kernel instead (linear_fused.cc AutoWgmmaPlan; the
    // bench's weights suit it whenever a group starts on a 64-row boundary).
    const std::vector<int64_t> group_rows(static_cast<size_t>(std::min<int64_t>(G, kernels::cuda::kFusedMaxWeights)), N);
    const std::optional<LinearPlan> wgmma_plan =
        fp8 && G <= kernels::cuda::kFusedMaxWeights && (G == 1 || N % 64 == 0)
            ? kernels::cuda::DeviceWgmmaPlan(t, group_rows, K)
            : std::nullopt;
    const bool wgmma_auto = wgmma_plan && t >= kernels::cuda::kWgmmaMinTokens && kernels::cuda::LinearWgmmaEnabled();
    const LinearPlan chosen = wgmma_auto ? *wgmma_plan : auto_plan;
    const size_t ours = time({.what = "ours", .plan = kernels::cuda::LinearPlanName(chosen)}, sets, wbytes,
                             [&ctx, &copies, base](int s) {
                               LinearArgs a = base;
                               a.w = copies[static_cast<size_t>(s)].get();
                               ctx.cuda.ops().Linear(a);
                             },
                             yg->data(), false, true);

    if (ctx.variants) {
      std::vector<std::pair<std::string, LinearPlan>> plans;
      // The other kernels, and plans around them: for FP8 the weight ring ("ring"), the split-K kernel with its
      // register ring ("reg") and the tiled kernel, each with its own plan, then ring depths and half / double
      // splits around the ring's plan; for BF16 the other kernel and split-K plans around the split-K one.
      auto add_plan = [&](const std::string& what, const std::optional<LinearPlan>& p) {
        if (!p) return;
        const std::string pn = kernels::cuda::LinearPlanName(*p);
        if (pn == kernels::cuda::LinearPlanName(chosen)) return;
        for (const auto& [w, q] : plans) {
          if (kernels::cuda::LinearPlanName(q) == pn) return;
        }
        plans.emplace_back(what, *p);
      };
      const int gi = static_cast<int>(G);
      // The wgmma kernel (sm_90a) and the mma.sync choice beside each other, whichever the launch takes; wgmma
      // clusters around its plan.
      if (kernels::cuda::LinearWgmmaEnabled() && wgmma_plan) {
        add_plan("mma", auto_plan);
        add_plan("wgmma", wgmma_plan);
        LinearPlan one_tile = *wgmma_plan;  // x staged for every tile: what row_tiles saves
        one_tile.row_tiles = 1;
        add_plan("wgmma rt1", one_tile);
        LinearPlan other_tile = *wgmma_plan;  // the other token tile (16 <-> 64 tokens a block)
        other_tile.n_tiles = wgmma_plan->n_tiles == 2 ? 8 : 2;
        if (kernels::cuda::CheckWgmmaPlan(other_tile, t, K, group_rows).ok()) add_plan("wgmma other tile", other_tile);
        for (const int c : {wgmma_plan->cluster / 2, wgmma_plan->cluster * 2}) {
          LinearPlan q = *wgmma_plan;
          q.cluster = c;
          q.k_slice = (K / 128 + c - 1) / std::max(1, c) * 128;
          q.row_tiles = std::max(1, c > wgmma_plan->cluster ? q.row_tiles * 2 : q.row_tiles / 2);
          if (c >= 1 && kernels::cuda::CheckWgmmaPlan(q, t, K, group_rows).ok()) add_plan(absl::StrCat("wgmma c", c), q);
        }
      }
      const std::optional<LinearPlan> ring =
          fp8 ? kernels::cuda::PlanRingLinear(t, N, K, gi, ctx.sms) : std::nullopt;
      if (ring) {
        // FP8: the three kernels with their own plans, then ring plans around the ring's.
        add_plan("ring", ring);
        add_plan("reg", kernels::cuda::PlanSplitKLinear(t, N, K, gi, ctx.sms));
        add_plan("tiled", kernels::cuda::PlanTiledLinear(t, N, K, gi, ctx.sms));
        const int splits = ring->warps_k * ring->cluster;
        for (int st = 2; st <= kernels::cuda::kMaxStages; ++st) {
          add_plan(absl::StrCat("st", st), kernels::cuda::PlanRingLinear(t, N, K, gi, ctx.sms, splits, st));
        }
        if (splits > 1) add_plan("s/2", kernels::cuda::PlanRingLinear(t, N, K, gi, ctx.sms, splits / 2));
        add_plan("s*2", kernels::cuda::PlanRingLinear(t, N, K, gi, ctx.sms, splits * 2));
      } else {
        const std::optional<LinearPlan> split = auto_plan.kernel == kernels::cuda::LinearKernel::kSplitK
                                                    ? std::optional<LinearPlan>(auto_plan)
                                                    : kernels::cuda::PlanSplitKLinear(t, N, K, gi, ctx.sms);
        if (auto_plan.kernel == kernels::cuda::LinearKernel::kSplitK) {
          add_plan("tiled", kernels::cuda::PlanTiledLinear(t, N, K, gi, ctx.sms));
        } else {
          add_plan("splitk", split);
        }
        if (split) {
          const int splits = split->warps_k * split->cluster;
          auto add = [&](const std::string& what, int m_tiles, int s) {
            if (s < 1 || s > 64) return;
            add_plan(what, kernels::cuda::PlanSplitKLinear(t, N, K, gi, ctx.sms, m_tiles, s));
          };
          add(split->m_tiles == 1 ? "m2" : "m1", split->m_tiles == 1 ? 2 : 1, splits);
          add("s/2", split->m_tiles, splits / 2);
          add("s*2", split->m_tiles, splits * 2);
        }
      }
      // The multi-weight kernel (linear_fused.cu) on this one weight, one entry per group: its default build
      // ("mw"), the bit-move dequantisation ("mw bits") and the lean build ("lean", "lean bits", up to 8 tokens).
      if (G <= kernels::cuda::kFusedMaxWeights) {
        const std::vector<int64_t> rows(static_cast<size_t>(G), N);
        add_plan("mw", kernels::cuda::PlanFusedLinear(t, rows, K, ctx.sms, kernels::cuda::kFusedMinBlocks));
        if (fp8) {
          add_plan("mw bits",
                   kernels::cuda::PlanFusedLinear(t, rows, K, ctx.sms, kernels::cuda::kFusedMinBlocks, 0, true));
        }
        add_plan("lean", kernels::cuda::PlanFusedLinear(t, rows, K, ctx.sms, kernels::cuda::kFusedLeanBlocks));
        if (fp8) {
          add_plan("lean bits",
                   kernels::cuda::PlanFusedLinear(t, rows, K, ctx.sms, kernels::cuda::kFusedLeanBlocks, 0, true));
        }
      }
      for (const auto& [what, plan] : plans) {
        auto err = std::make_shared<absl::Status>();
        const size_t i = time({.what = what, .plan = kernels::cuda::LinearPlanName(plan)}, sets, wbytes,
                              [&ctx, &copies, base, plan, err](int s) {
                                LinearArgs a = base;
                                a.w = copies[static_cast<size_t>(s)].get();
                                absl::Status st = kernels::cuda::LaunchLinearWithPlan(a, &plan, ctx.gpu.stream());
                                if (!st.ok() && err->ok()) *err = st;
                              },
                              yg->data(), false, true);
        if (!err->ok()) {
          if (cells[i].r.ok) ++ctx.failures;
          cells[i].r.ok = false;
          cells[i].r.error = err->ToString();
        }
      }
    }

    if (peers && fp8) {
      if (N % 128 != 0) {
        cells.push_back({.what = "lt_fp8", .plan = "N % 128 != 0 (no group-sliced scales)"});
      } else {
        auto call = std::make_shared<LtCall>(prepare_lt_fp8(t, std::max(ctx.vec128_layout, 0)));
        if (!call->status.ok()) {
          cells.push_back({.what = "lt_fp8", .plan = call->status.ToString()});
        } else {
          time({.what = "lt_fp8", .plan = call->note}, sets, wbytes,
               [call, &enqueue_lt_fp8](int s) { enqueue_lt_fp8(*call, s); }, yq.data(),
               call->gemms[0]->d_type != CUDA_R_32F, false);
        }
      }
    }
    if (peers) {
      auto gemms = std::make_shared<std::vector<std::shared_ptr<CublasLt::Gemm>>>();
      absl::Status st;
      for (int64_t g = 0; g < G && st.ok(); ++g) {
        absl::StatusOr<std::shared_ptr<CublasLt::Gemm>> gm = ctx.lt->PrepareBf16(N, t, K, K, KT, NT);
        if (gm.ok()) {
          gemms->push_back(*std::move(gm));
        } else {
          st = gm.status();
        }
      }
      if (!st.ok()) {
        cells.push_back({.what = "lt_bf16", .plan = st.ToString()});
      } else {
        time({.what = "lt_bf16", .plan = ""}, static_cast<int>(w16.size()), 2.0 * NT * K,
             [&ctx, gemms, &w16, &x16g, &y16, G, N, K](int s) {
               for (int64_t g = 0; g < G; ++g) {
                 (void)ctx.lt->Run(*(*gemms)[static_cast<size_t>(g)],
                                   w16[static_cast<size_t>(s)].as<const uint16_t>() + g * N * K,
                                   x16g.as<const uint16_t>() + g * K, y16.as<float>() + g * N, ctx.gpu.stream());
               }
             },
             y16.data(), false, false);
      }
    }

    // The row.
    auto find = [&](const std::string& what) -> const Cell* {
      for (const Cell& c : cells) {
        if (c.what == what) return &c;
      }
      return nullptr;
    };
    auto us = [](const Cell* c) { return c != nullptr && c->ran && c->r.median_us > 0 ? c->r.median_us : 0.0; };
    const Cell* o = &cells[ours];
    std::string others;
    for (const Cell& c : cells) {
      if (c.what == "ours" || c.what == "lt_fp8" || c.what == "lt_bf16") continue;
      absl::StrAppend(&others, others.empty() ? "" : ", ", c.what, " ", absl::StrFormat("%.2f", us(&c)),
                      c.r.ok ? "" : " (failed)");
    }
    auto peer_cols = [&](const Cell* c) {
      if (c == nullptr) return std::string("- | - | -");
      if (!c->ran) return absl::StrCat("n/a: ", c->plan, " | - | -");
      std::string cell = absl::StrFormat("%.2f", us(c));
      if (!c->plan.empty()) absl::StrAppend(&cell, " (", c->plan, ")");
      absl::StrAppend(&cell, absl::StrFormat(" | %.1f%% | %.2g", c->r.pct_copy, c->err.rel));
      if (!c->r.ok) absl::StrAppend(&cell, " (", c->r.error, ")");
      return cell;
    };
    std::string fastest;
    double best = 1e30;
    for (const Cell& c : cells) {
      if (c.ran && c.r.ok && us(&c) > 0 && us(&c) < best) best = us(&c), fastest = c.what;
    }
    std::string plan = o->plan;
    if (!o->r.ok) absl::StrAppend(&plan, " FAILED: ", o->r.error);
    std::printf("| %lld | %.2f | %.0f | %.1f%% | %.2f | %.2g | %s | %s | %s | %s | %s |\n",
                static_cast<long long>(t), us(o), o->r.gbs, o->r.pct_copy, us(o) / floor_us, o->err.rel,
                plan.c_str(), others.c_str(), peer_cols(find("lt_fp8")).c_str(), peer_cols(find("lt_bf16")).c_str(),
                fastest.c_str());
    std::fflush(stdout);
    for (const Cell& c : cells) {
      ctx.json.push_back({{"names", sh.names}, {"shape", shape}, {"format", kernels::WeightFormatName(sh.format)},
                          {"n", N}, {"k", K}, {"groups", G}, {"t", t}, {"what", c.what}, {"plan", c.plan},
                          {"ran", c.ran}, {"ok", c.r.ok}, {"error", c.r.error}, {"sets", c.r.sets},
                          {"rotated_mb", c.r.rotated_mb}, {"median_us", c.r.median_us}, {"p10_us", c.r.p10_us},
                          {"p90_us", c.r.p90_us}, {"floor_bytes", floor_bytes}, {"floor_us", floor_us},
                          {"gbs", c.r.gbs}, {"pct_copy", c.r.pct_copy}, {"rel_err", c.err.rel},
                          {"max_abs_err", c.err.max_abs}});
    }
  }
  std::fprintf(stderr, "[%s: %.1f s]\n", name.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t_shape).count());
}

// --once: each plan kind of `kinds` once per T, in order (auto: AutoLinearPlan; ring: the FP8 weight ring; reg:
// the split-K plan with the register ring; tiled: the tiled kernel; wgmma: the sm_90a kernel's DeviceWgmmaPlan, which
// the backend takes on its own from 33 tokens), so a profiler's launch list maps onto the printed lines.
int RunOnce(Backend& cuda, CudaBackend& gpu, const Shape& sh, const std::vector<int64_t>& tokens, int sms,
            const std::vector<std::string>& kinds, uint64_t seed) {
  const int64_t G = sh.groups, NT = sh.n * G, KT = sh.k * G;
  const int64_t max_t = *std::max_element(tokens.begin(), tokens.end());
  const HostLinear host = SynthLinear("bench." + sh.names[0], sh.format, NT, sh.k, seed);
  absl::StatusOr<LinearHandle> w = cuda.PrepareLinear(host.view);
  if (!w.ok()) return 1;
  Buffer xg = Upload(cuda, RandomFloats(max_t * KT, seed + 1));
  absl::StatusOr<Buffer> yg = cuda.Allocate(max_t * NT * 4, MemoryKind::kWorkspace);
  if (!yg.ok()) return 1;
  int failures = 0;
  for (const int64_t t : tokens) {
    for (const std::string& kind : kinds) {
      LinearPlan plan = kernels::cuda::AutoLinearPlan(t, sh.n, sh.k, static_cast<int>(G), sms, KernelFormat(sh));
      if (kind == "reg") {
        std::optional<LinearPlan> p = kernels::cuda::PlanSplitKLinear(t, sh.n, sh.k, static_cast<int>(G), sms);
        if (!p) continue;
        plan = *p;
      } else if (kind == "tiled") {
        plan = kernels::cuda::PlanTiledLinear(t, sh.n, sh.k, static_cast<int>(G), sms);
      } else if (kind == "wgmma") {  // the sm_90a kernel's device plan (FP8, groups on 64-row boundaries)
        const std::vector<int64_t> rows(static_cast<size_t>(G), sh.n);
        const bool suits = KernelFormat(sh) == kernels::cuda::LinearKernelFormat::kFp8 &&
                           G <= kernels::cuda::kFusedMaxWeights && (G == 1 || sh.n % 64 == 0) &&
                           kernels::cuda::LinearWgmmaRunsHere();
        std::optional<LinearPlan> p = suits ? kernels::cuda::DeviceWgmmaPlan(t, rows, sh.k) : std::nullopt;
        if (!p) continue;
        plan = *p;
      } else if (kind == "ring") {
        std::optional<LinearPlan> p = kernels::cuda::PlanRingLinear(t, sh.n, sh.k, static_cast<int>(G), sms);
        if (!p) continue;
        plan = *p;
      }
      const LinearArgs a{.w = w->get(), .x = {.data = xg.data(), .dtype = DType::kF32}, .y = yg->as<float>(),
                         .t = t, .groups = static_cast<int>(G)};
      const absl::Status st = kernels::cuda::LaunchLinearWithPlan(a, &plan, gpu.stream());
      const absl::Status done = cuda.Synchronize();
      std::printf("once: %s %s T=%lld %s: %s\n", sh.names[0].c_str(), ShapeName(sh).c_str(),
                  static_cast<long long>(t), kernels::cuda::LinearPlanName(plan).c_str(),
                  st.ok() && done.ok() ? "ok" : (st.ok() ? done : st).ToString().c_str());
      if (!st.ok() || !done.ok()) ++failures;
    }
  }
  return failures;
}

// Weights that read the same x, as model/dsv4 fuses them with ModelOptions::fuse_projections (attention.cc), plus
// the shared expert's w1 + w3 (the same x inside the MoE op; not wired: kernels/cuda/moe_launch.cc would call
// LaunchFusedLinear).
struct FusedGroup {
  std::string name;
  int64_t k = 0;
  std::vector<std::string> names;
  std::vector<WeightFormat> formats;
  std::vector<int64_t> rows;
};

std::vector<FusedGroup> MakeFusedGroups(const Config& c, const std::vector<int64_t>& tps) {
  std::vector<FusedGroup> out;
  const WeightFormat fp8 = WeightFormat::kFp8Block128, bf16 = WeightFormat::kBF16;
  auto add = [&](FusedGroup g) {
    for (FusedGroup& o : out) {
      if (o.k == g.k && o.rows == g.rows && o.formats == g.formats) {
        o.name += " = " + g.name;
        return;
      }
    }
    out.push_back(std::move(g));
  };
  for (const int64_t tp : tps) {
    const std::string sfx = tp == 1 ? "" : absl::StrCat(" tp", tp);
    const int64_t heads = c.num_attention_heads / tp, D = c.hidden_size, hd = c.head_dim;
    const int64_t shared = c.moe_intermediate_size * c.n_shared_experts / tp;
    const int64_t ihd = c.index_head_dim;
    add({.name = "x of a ratio-4 layer" + sfx, .k = D,
         .names = {"wq_a", "wkv", "compressor.wkv", "compressor.wgate", "indexer.weights_proj",
                   "indexer.compressor.wkv", "indexer.compressor.wgate"},
         .formats = {fp8, fp8, bf16, bf16, bf16, bf16, bf16},
         .rows = {c.q_lora_rank, hd, 2 * hd, 2 * hd, c.index_n_heads, 2 * ihd, 2 * ihd}});
    add({.name = "x of a ratio-128 layer" + sfx, .k = D,
         .names = {"wq_a", "wkv", "compressor.wkv", "compressor.wgate"},
         .formats = {fp8, fp8, bf16, bf16},
         .rows = {c.q_lora_rank, hd, hd, hd}});
    add({.name = "x of a ratio-0 layer" + sfx, .k = D, .names = {"wq_a", "wkv"}, .formats = {fp8, fp8},
         .rows = {c.q_lora_rank, hd}});
    add({.name = "c_q of a ratio-4 layer" + sfx, .k = c.q_lora_rank, .names = {"wq_b", "indexer.wq_b"},
         .formats = {fp8, fp8}, .rows = {heads * hd, c.index_n_heads * ihd}});
    add({.name = "shared w1+w3 (not wired)" + sfx, .k = D, .names = {"shared.w1", "shared.w3"},
         .formats = {fp8, fp8}, .rows = {shared, shared}});
  }
  return out;
}

// One group per T: the separate linears (one LaunchLinear each, in one graph: the model without the option),
// the ops' FusedLinear (what the model launches with it) and each build of the multi-weight kernel with its own
// plan, against the floor of the group's bytes. Every column's outputs are checked against the CPU reference.
void RunFusedGroup(Ctx& ctx, const FusedGroup& fg) {
  const size_t count = fg.rows.size();
  const int64_t K = fg.k;
  const bool all_fp8 = std::all_of(fg.formats.begin(), fg.formats.end(),
                                   [](kernels::WeightFormat f) { return f == kernels::WeightFormat::kFp8Block128; });
  int64_t rows_sum = 0;
  double wbytes = 0;
  std::vector<std::string> parts;
  for (size_t i = 0; i < count; ++i) {
    rows_sum += fg.rows[i];
    wbytes += WeightBytes({.names = {}, .format = fg.formats[i], .n = fg.rows[i], .k = K, .groups = 1});
    parts.push_back(absl::StrFormat("%s %s [%d, %d]", fg.names[i], kernels::WeightFormatName(fg.formats[i]),
                                    fg.rows[i], K));
  }
  std::printf("\n### group: %s: %s; %.2f MB\n\n", fg.name.c_str(), absl::StrJoin(parts, ", ").c_str(), wbytes / 1e6);
  std::vector<HostLinear> host;
  for (size_t i = 0; i < count; ++i) {
    host.push_back(SynthLinear("bench.group." + fg.names[i], fg.formats[i], fg.rows[i], K, ctx.seed += 101));
  }
  const std::vector<float> x = MakeX(ctx, K, ctx.seed + 1);
  const int64_t R = std::min<int64_t>(ctx.ref_tokens, ctx.max_t);
  std::vector<std::vector<float>> ref(count);
  {
    const std::vector<float> xr(x.begin(), x.begin() + R * K);
    Buffer xb = Upload(ctx.cpu, xr);
    for (size_t i = 0; i < count; ++i) {
      absl::StatusOr<LinearHandle> w = ctx.cpu.PrepareLinear(host[i].view);
      absl::StatusOr<Buffer> yb = ctx.cpu.Allocate(R * fg.rows[i] * 4, MemoryKind::kWorkspace);
      if (!w.ok() || !yb.ok()) std::exit(3);
      ctx.cpu.ops().Linear({.w = w->get(), .x = {.data = xb.data()}, .y = yb->as<float>(), .t = R});
      if (!ctx.cpu.Synchronize().ok()) std::exit(3);
      ref[i] = DownloadRows(ctx.cpu, yb->data(), R, fg.rows[i], false);
    }
  }
  const int sets = SetsFor(ctx, wbytes);
  std::vector<std::vector<LinearHandle>> copies(static_cast<size_t>(sets));
  for (auto& set : copies) {
    for (size_t i = 0; i < count; ++i) {
      absl::StatusOr<LinearHandle> w = ctx.cuda.PrepareLinear(host[i].view);
      if (!w.ok()) {
        std::printf("PrepareLinear: %s\n", w.status().ToString().c_str());
        ++ctx.failures;
        return;
      }
      set.push_back(*std::move(w));
    }
  }
  Buffer xg = Upload(ctx.cuda, x);
  std::vector<Buffer> ys;
  for (size_t i = 0; i < count; ++i) {
    absl::StatusOr<Buffer> y = ctx.cuda.Allocate(ctx.x_rows * fg.rows[i] * 4, MemoryKind::kWorkspace);
    if (!y.ok()) std::exit(3);
    ys.push_back(*std::move(y));
  }
  auto args = [&](int s, int64_t t) {
    kernels::FusedLinearArgs a{.x = {.data = xg.data()}, .t = t, .count = static_cast<int>(count)};
    for (size_t i = 0; i < count; ++i) {
      a.out[i] = {.w = copies[static_cast<size_t>(s)][i].get(), .y = ys[i].as<float>()};
    }
    return a;
  };
  std::printf("| T | separate us | fused us | plan | default | bits | lean | lean bits | floor us | %% copy (fused) | "
              "x floor | speed-up vs separate | rel err |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  for (const int64_t t : ctx.tokens) {
    const double floor_bytes = wbytes + 4.0 * t * K + 4.0 * t * rows_sum;
    const double floor_us = floor_bytes / ctx.copy_bps * 1e6;
    const int64_t rows = std::min(t, R);
    struct Col {
      std::string what{}, plan{};
      Result r{};
      double err = -1;
    };
    std::vector<Col> cols;
    auto time = [&](const std::string& what, const std::string& plan, std::function<void(int)> enqueue) {
      Col col{.what = what, .plan = plan};
      Case c{.family = "gemm_group", .op = what, .shape = absl::StrFormat("%s T=%d", fg.name, t),
             .params = {{"group", fg.name}, {"names", fg.names}, {"rows", fg.rows}, {"k", K}, {"t", t},
                        {"plan", plan}},
             .max_sets = sets, .rotated_bytes_per_set = wbytes, .enqueue = std::move(enqueue),
             .bytes = [floor_bytes](int) { return floor_bytes; },
             .prepare = [&]() {
               for (size_t i = 0; i < count; ++i) {
                 ctx.cuda.ops().Fill({.x = ys[i].as<float>(), .n = ctx.x_rows * fg.rows[i],
                                      .value = std::numeric_limits<float>::quiet_NaN()});
               }
               return ctx.cuda.Synchronize();
             },
             .check = [&]() -> absl::Status {
               double worst = 0;
               for (size_t i = 0; i < count; ++i) {
                 const std::vector<float> got = DownloadRows(ctx.cuda, ys[i].data(), rows, fg.rows[i], false);
                 const Err e = Compare(got, std::vector<float>(ref[i].begin(), ref[i].begin() + rows * fg.rows[i]));
                 if (e.non_finite) return absl::DataLossError(absl::StrCat(fg.names[i], ": non-finite output"));
                 worst = std::max(worst, e.rel);
               }
               col.err = worst;
               if (worst > kOurMaxRel) return absl::DataLossError(absl::StrFormat("rel err %.3g", worst));
               return absl::OkStatus();
             }};
      col.r = ctx.runner.Run(ctx.cuda, c);
      if (!col.r.ok) {
        ++ctx.failures;
        std::printf("  %s T=%lld failed: %s\n", what.c_str(), static_cast<long long>(t), col.r.error.c_str());
      }
      ctx.json.push_back({{"group", fg.name}, {"t", t}, {"what", what}, {"plan", plan}, {"us", col.r.median_us},
                          {"p10_us", col.r.p10_us}, {"p90_us", col.r.p90_us}, {"floor_us", floor_us},
                          {"pct_copy", col.r.pct_copy}, {"rel_err", col.err}, {"ok", col.r.ok}});
      cols.push_back(col);
    };
    time("separate", "one LaunchLinear each (AutoLinearPlan)", [&, t](int s) {
      const kernels::FusedLinearArgs a = args(s, t);
      for (int i = 0; i < a.count; ++i) ctx.cuda.ops().Linear({.w = a.out[i].w, .x = a.x, .y = a.out[i].y, .t = t});
    });
    time("fused", "ops FusedLinear", [&, t](int s) { ctx.cuda.ops().FusedLinear(args(s, t)); });
    struct Build {
      const char* what;
      int min_blocks;
      bool bits;
    };
    for (const Build& b : {Build{"default", kernels::cuda::kFusedMinBlocks, false},
                           Build{"bits", kernels::cuda::kFusedMinBlocks, true},
                           Build{"lean", kernels::cuda::kFusedLeanBlocks, false},
                           Build{"lean bits", kernels::cuda::kFusedLeanBlocks, true}}) {
      const std::optional<LinearPlan> plan =
          kernels::cuda::PlanFusedLinear(t, fg.rows, K, ctx.sms, b.min_blocks, 0, b.bits);
      if (!plan || !ctx.variants) continue;
      time(b.what, kernels::cuda::LinearPlanName(*plan), [&, t, plan](int s) {
        const absl::Status st =
            kernels::cuda::LaunchFusedLinearWithPlan(args(s, t), &*plan, ctx.gpu.stream());
        if (!st.ok()) std::fprintf(stderr, "fused launch: %s\n", st.ToString().c_str());
      });
    }
    // The wgmma kernel (sm_90a; FP8 groups only) on the group, forced: FusedLinear takes it on its own from
    // kWgmmaMinTokens, so "fused" above is this plan there.
    if (const std::optional<LinearPlan> wplan =
            kernels::cuda::LinearWgmmaEnabled() ? kernels::cuda::DeviceWgmmaPlan(t, fg.rows, K) : std::nullopt;
        wplan && ctx.variants && all_fp8) {
      time("wgmma", kernels::cuda::LinearPlanName(*wplan), [&, t, wplan](int s) {
        const absl::Status st = kernels::cuda::LaunchFusedLinearWithPlan(args(s, t), &*wplan, ctx.gpu.stream());
        if (!st.ok()) std::fprintf(stderr, "wgmma launch: %s\n", st.ToString().c_str());
      });
    }
    auto find = [&](const std::string& what) -> const Col* {
      for (const Col& c : cols) {
        if (c.what == what && c.r.ok) return &c;
      }
      return nullptr;
    };
    auto cell = [&](const std::string& what) {
      const Col* c = find(what);
      return c ? absl::StrFormat("%.1f", c->r.median_us) : std::string("-");
    };
    const Col* sep = find("separate");
    const Col* fused = find("fused");
    double worst_err = 0;
    for (const Col& c : cols) worst_err = std::max(worst_err, c.err);
    std::printf("| %lld | %s | %s | %s | %s | %s | %s | %s | %.2f | %s | %s | %s | %.2g |\n",
                static_cast<long long>(t), cell("separate").c_str(), cell("fused").c_str(),
                fused ? fused->plan.c_str() : "-", cell("default").c_str(), cell("bits").c_str(), cell("lean").c_str(),
                cell("lean bits").c_str(), floor_us,
                fused ? absl::StrFormat("%.0f%%", fused->r.pct_copy).c_str() : "-",
                fused ? absl::StrFormat("%.1f", fused->r.median_us / floor_us).c_str() : "-",
                (sep && fused) ? absl::StrFormat("%.2fx", sep->r.median_us / fused->r.median_us).c_str() : "-",
                worst_err);
    std::fflush(stdout);
  }
}

absl::StatusOr<Config> ReadConfig(const std::string& path) {
  if (path.empty()) return Config{};
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str());
}

int Main() {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<Config> config = ReadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::fprintf(stderr, "config: %s\n", config.status().ToString().c_str());
    return 2;
  }
  const std::vector<int64_t> tps = ParseList("tp", absl::GetFlag(FLAGS_tp));
  const std::vector<int64_t> tokens = ParseList("tokens", absl::GetFlag(FLAGS_tokens));
  std::vector<Shape> shapes = MakeShapes(*config, tps, absl::GetFlag(FLAGS_fused));
  const std::vector<std::string> only = absl::StrSplit(absl::GetFlag(FLAGS_only), ',', absl::SkipEmpty());
  if (!only.empty()) {
    std::erase_if(shapes, [&](const Shape& s) {
      return std::none_of(s.names.begin(), s.names.end(),
                          [&](const std::string& n) { return std::find(only.begin(), only.end(), n) != only.end(); });
    });
  }

  if (absl::GetFlag(FLAGS_plans)) {
    const int sms = absl::GetFlag(FLAGS_sms);
    for (const Shape& s : shapes) {
      std::printf("%s: %s\n", absl::StrJoin(s.names, " = ").c_str(), ShapeName(s).c_str());
      for (const int64_t t : tokens) {
        const LinearPlan p = kernels::cuda::AutoLinearPlan(t, s.n, s.k, s.groups, sms, KernelFormat(s));
        std::printf("  T=%-4lld %s, %lld bytes of shared memory\n", static_cast<long long>(t),
                    kernels::cuda::LinearPlanName(p).c_str(),
                    static_cast<long long>(p.min_blocks > 0
                                               ? kernels::cuda::internal::FusedSharedBytes(p, std::min<int64_t>(t, 8 * p.n_tiles))
                                               : kernels::cuda::internal::LinearSharedBytes(p)));
        // sm_90a takes the wgmma kernel from kWgmmaMinTokens where it plans (FP8, groups on 64-row boundaries).
        const std::vector<int64_t> rows(static_cast<size_t>(std::min<int64_t>(s.groups, 8)), s.n);
        if (KernelFormat(s) == kernels::cuda::LinearKernelFormat::kFp8 && s.groups <= 8 &&
            (s.groups == 1 || s.n % 64 == 0)) {
          if (const auto w = kernels::cuda::PlanWgmmaLinear(t, rows, s.k, sms)) {
            std::printf("         sm_90a%s: %s, %lld bytes of shared memory\n",
                        t >= kernels::cuda::kWgmmaMinTokens ? "" : " (variant only)",
                        kernels::cuda::LinearPlanName(*w).c_str(),
                        static_cast<long long>(kernels::cuda::internal::WgmmaSharedBytes(w->k_slice, w->cluster,
                                                                                  8 * w->n_tiles)));
          }
        }
      }
    }
    if (absl::GetFlag(FLAGS_groups)) {
      for (const FusedGroup& g : MakeFusedGroups(*config, tps)) {
        std::printf("group %s: %s\n", g.name.c_str(), absl::StrJoin(g.names, " + ").c_str());
        for (const int64_t t : tokens) {
          for (const int mb : {kernels::cuda::kFusedMinBlocks, kernels::cuda::kFusedLeanBlocks}) {
            const std::optional<LinearPlan> p = kernels::cuda::PlanFusedLinear(t, g.rows, g.k, sms, mb);
            if (!p) continue;
            std::printf("  T=%-4lld %s, %lld bytes of shared memory\n", static_cast<long long>(t),
                        kernels::cuda::LinearPlanName(*p).c_str(),
                        static_cast<long long>(kernels::cuda::internal::FusedSharedBytes(
                            *p, std::min<int64_t>(t, 8 * p->n_tiles))));
          }
        }
      }
    }
    return 0;
  }

  absl::StatusOr<std::unique_ptr<Backend>> made = kernels::cuda::MakeCudaBackend(0);
  if (!made.ok()) {
    std::fprintf(stderr, "CUDA backend: %s\n", made.status().ToString().c_str());
    return 2;
  }
  Backend& cuda = **made;
  auto& gpu = static_cast<CudaBackend&>(cuda);
  if (const std::string once = absl::GetFlag(FLAGS_once); !once.empty()) {
    const std::vector<std::string> kinds = absl::StrSplit(once, ',', absl::SkipEmpty());
    const DeviceInfo info = GetDeviceInfo(cuda);
    int failures = 0;
    for (const Shape& s : shapes) {
      failures += RunOnce(cuda, gpu, s, tokens, info.sms > 0 ? info.sms : 132, kinds, absl::GetFlag(FLAGS_seed));
    }
    return failures == 0 ? 0 : 1;
  }
  const int threads = absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads)
                                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::unique_ptr<Backend> cpu = kernels::cpu::MakeCpuBackend(threads);
  const DeviceInfo device = GetDeviceInfo(cuda);
  absl::StatusOr<double> copy_bw = MeasureCopyBandwidth(cuda, int64_t{1} << 30);
  if (!copy_bw.ok()) {
    std::fprintf(stderr, "copy bandwidth: %s\n", copy_bw.status().ToString().c_str());
    return 2;
  }
  const RunOptions run{.reps = absl::GetFlag(FLAGS_reps), .warmup = 3,
                       .warmup_s = absl::GetFlag(FLAGS_warmup_ms) * 1e-3,
                       .replay_budget_s = absl::GetFlag(FLAGS_replay_budget_ms) * 1e-3};
  Runner runner(run, *copy_bw, device.l2_bytes);

  Ctx ctx{.cuda = cuda, .gpu = gpu, .cpu = *cpu, .runner = runner};
  ctx.copy_bps = *copy_bw;
  ctx.sms = device.sms > 0 ? device.sms : 132;
  ctx.tokens = tokens;
  ctx.max_t = *std::max_element(tokens.begin(), tokens.end());
  ctx.x_rows = std::max<int64_t>(4, (ctx.max_t + 3) / 4 * 4);
  ctx.ref_tokens = std::max(1, absl::GetFlag(FLAGS_ref_tokens));
  ctx.rotate_bytes = absl::GetFlag(FLAGS_rotate_mb) * 1e6;
  ctx.variants = absl::GetFlag(FLAGS_variants);
  ctx.seed = absl::GetFlag(FLAGS_seed);

  constexpr size_t kWorkspace = size_t{32} << 20;
  std::unique_ptr<CublasLt> lt;
  absl::StatusOr<Buffer> workspace = cuda.Allocate(kWorkspace, MemoryKind::kWorkspace);
  if (absl::GetFlag(FLAGS_peers) && workspace.ok()) {
    absl::StatusOr<std::unique_ptr<CublasLt>> loaded = CublasLt::Load(workspace->data(), kWorkspace);
    if (loaded.ok()) {
      lt = *std::move(loaded);
      ctx.lt = lt.get();
    } else {
      ctx.lt_missing = loaded.status().ToString();
    }
  }

  const std::string peer = lt ? lt->description() : absl::StrCat("unavailable: ", ctx.lt_missing);
  std::printf("# dsv4-gemm-bench on %s\n\n", device.name.c_str());
  std::printf("Device-to-device copy of 1 GiB: %.0f GB/s (read + written bytes); L2 %.0f MB; %d replays per case, "
              "weights rotated through %.0f MB; CPU reference: %d threads, first %d tokens. Peers: %s.\n",
              *copy_bw / 1e9, device.l2_bytes / 1e6, run.reps, ctx.rotate_bytes / 1e6, threads, ctx.ref_tokens,
              peer.c_str());
  std::printf("Columns: floor bytes = weight as stored + x f32 + y f32; %% copy = floor bytes / time over the copy "
              "bandwidth; x floor = time / (floor bytes / copy bandwidth); rel err = ||y - y_cpu|| / ||y_cpu|| "
              "over the first min(T, %d) tokens. cuBLASLt FP8 times the GEMM only (x quantised to e4m3 beforehand, "
              "not timed); grouped shapes run one product per group.\n",
              ctx.ref_tokens);

  std::vector<FusedGroup> groups;
  if (absl::GetFlag(FLAGS_groups)) groups = MakeFusedGroups(*config, tps);
  if (!only.empty()) {  // groups whose name contains one of --only's words
    std::erase_if(groups, [&](const FusedGroup& g) {
      return std::none_of(only.begin(), only.end(),
                          [&](const std::string& n) { return g.name.find(n) != std::string::npos; });
    });
  }
  if (!absl::GetFlag(FLAGS_singles)) shapes.clear();
  // The JSON after each case, so a run cut short keeps what it measured.
  auto write_json = [&] {
    if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
      std::ofstream out(path);
      out << nlohmann::json{{"run",
                             {{"date", Now()}, {"tag", absl::GetFlag(FLAGS_tag)}, {"device", device.name},
                              {"copy_gb_per_s", *copy_bw / 1e9}, {"reps", run.reps},
                              {"rotate_mb", ctx.rotate_bytes / 1e6},
                              {"peer", peer},
                              {"vec128_layout", ctx.vec128_layout}}},
                            {"results", ctx.json}}
                 .dump(1)
          << "\n";
    }
  };
  // The groups first: they are the cases the next decision rests on (ModelOptions::fuse_projections).
  for (const FusedGroup& g : groups) {
    RunFusedGroup(ctx, g);
    write_json();
  }
  for (const Shape& s : shapes) {
    RunShape(ctx, s);
    write_json();
  }
  absl::StatusOr<double> copy_end = MeasureCopyBandwidth(cuda, int64_t{1} << 30);
  std::printf("\n%d failures; copy bandwidth at the end %.0f GB/s; %.1f s in all.\n", ctx.failures,
              copy_end.ok() ? *copy_end / 1e9 : 0.0,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return ctx.failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dsv4::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dsv4::bench::Main();
}
