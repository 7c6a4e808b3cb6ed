// dsv4-decode-bench: the whole DeepSeek-V4 decode step at full size (issue 18; docs/decode-bench.md). Builds the
// model of --config with synthetic weights (no checkpoint on disk), fills the KV pools for --context, captures the
// worker's decode graphs and times real decode steps for every (batch, context): step ms, tokens/s, GPU time by
// phase (attention, indexer, MoE, dense, comm stand-in, other), graph nodes, the experts the step touched, the
// byte floor and the step's % of it. Markdown table on stdout, JSON (--json), SVG (--svg).
//
//   dsv4-decode-bench --layers fit                             world 1, as many flash layers as fit (~2-3 min)
//   dsv4-decode-bench --simulate-rank 0 --simulate-world 4     rank 0 of TP 4, all 43 layers, comm modelled
//   dsv4-decode-bench --backend cpu --config configs/tiny.json --layers 2 --batches 1,2 --context 64
// Exit status 0 when every point ran; 1 otherwise (the points that ran are still written).
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/decode/decode_bench.h"
#include "bench/decode/report.h"
#include "bench/ops/flag_lists.h"

ABSL_FLAG(std::string, backend, "cuda", "cuda | cpu");
ABSL_FLAG(int, device, 0, "CUDA device");
ABSL_FLAG(int, threads, 0, "cpu backend threads (0: all cores)");
ABSL_FLAG(std::string, config, "configs/flash.json", "config.json of the model");
ABSL_FLAG(std::string, layers, "all", "main layers: all, fit (as many as the device holds at the largest point) or N");
ABSL_FLAG(int, simulate_rank, 0, "hold exactly this rank's shard of a --simulate-world group");
ABSL_FLAG(int, simulate_world, 1, "tensor-parallel world to simulate (collectives replaced by a counting stand-in)");
ABSL_FLAG(std::string, experts, "nvfp4", "routed expert format: nvfp4 | mxfp4");
ABSL_FLAG(std::string, batches, "1,8,32,64,128", "sequences per step (each a graph bucket)");
ABSL_FLAG(std::string, context, "8192,32768", "positions already in the cache of every sequence");
ABSL_FLAG(std::string, routing, "random", "random | skewed (20% of the experts get ~80% of the pairs)");
ABSL_FLAG(bool, cuda_graphs, true, "replay the worker's captured decode graphs (false: eager steps)");
ABSL_FLAG(std::string, attention_kernel, "mma", "sparse-MLA decode kernel: mma | simt");
ABSL_FLAG(bool, fuse_projections, true,
          "ModelOptions::fuse_projections: the projections that read the same input as one FusedLinear launch");
ABSL_FLAG(int, warmup, 3, "untimed steps per point");
ABSL_FLAG(int, reps, 10, "timed steps per point (median)");
ABSL_FLAG(int, phase_reps, 3, "timed replays per point for the phase split");
ABSL_FLAG(int, page_rows, 64, "rows per KV page");
ABSL_FLAG(uint64_t, seed, 1, "seed of the synthetic weights, cache rows and tokens");
ABSL_FLAG(double, fit_reserve_gib, 12, "--layers fit: device memory kept for workspace, scratch and graphs");
ABSL_FLAG(double, comm_busbw_gbs, 0, "all-reduce bus bandwidth for the modelled comm time (GB/s; 0: none)");
ABSL_FLAG(double, comm_latency_us, 0, "per-collective latency for the modelled comm time (us)");
ABSL_FLAG(std::string, json, "", "write every point to this JSON file");
ABSL_FLAG(std::string, svg, "", "write step time and floor vs batch to this SVG file");
ABSL_FLAG(std::string, title, "", "SVG title (default: a summary of the run)");

namespace dsv4::bench {
namespace {

// The flag's non-empty list into `out`; false (the reason printed) on a bad item or an empty list.
template <typename T>
bool ParseList(const std::string& flag, const std::string& text, std::vector<T>* out) {
  absl::StatusOr<std::vector<int64_t>> list = ParsePositiveList(flag, text);
  if (!list.ok()) {
    std::fprintf(stderr, "%s\n", std::string(list.status().message()).c_str());
    return false;
  }
  if (list->empty()) {
    std::fprintf(stderr, "--%s is empty\n", flag.c_str());
    return false;
  }
  for (int64_t v : *list) {
    if (v > std::numeric_limits<T>::max()) {
      std::fprintf(stderr, "--%s: '%lld' is not a positive integer\n", flag.c_str(), static_cast<long long>(v));
      return false;
    }
  }
  out->assign(list->begin(), list->end());
  return true;
}

int Main() {
  DecodeBenchOptions o;
  o.backend = absl::GetFlag(FLAGS_backend);
  o.device = absl::GetFlag(FLAGS_device);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.config_path = absl::GetFlag(FLAGS_config);
  o.layers = absl::GetFlag(FLAGS_layers);
  o.rank = absl::GetFlag(FLAGS_simulate_rank);
  o.world = absl::GetFlag(FLAGS_simulate_world);
  absl::StatusOr<ExpertFormat> ef = ParseExpertFormat(absl::GetFlag(FLAGS_experts));
  absl::StatusOr<RoutingSpec> rs = ParseRouting(absl::GetFlag(FLAGS_routing), absl::GetFlag(FLAGS_seed));
  if (!ef.ok() || !rs.ok()) {
    std::fprintf(stderr, "%s\n", (!ef.ok() ? ef.status() : rs.status()).ToString().c_str());
    return 2;
  }
  o.experts = *ef;
  o.routing = *rs;
  if (!ParseList("batches", absl::GetFlag(FLAGS_batches), &o.batches) ||
      !ParseList("context", absl::GetFlag(FLAGS_context), &o.contexts)) {
    return 2;
  }
  o.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  o.attention_kernel = absl::GetFlag(FLAGS_attention_kernel);
  o.fuse_projections = absl::GetFlag(FLAGS_fuse_projections);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.reps = absl::GetFlag(FLAGS_reps);
  o.phase_reps = absl::GetFlag(FLAGS_phase_reps);
  o.page_rows = absl::GetFlag(FLAGS_page_rows);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.fit_reserve_gib = absl::GetFlag(FLAGS_fit_reserve_gib);
  o.comm_busbw_gbs = absl::GetFlag(FLAGS_comm_busbw_gbs);
  o.comm_latency_us = absl::GetFlag(FLAGS_comm_latency_us);

  absl::StatusOr<std::unique_ptr<DecodeBench>> bench = DecodeBench::Setup(o);
  if (!bench.ok()) {
    std::fprintf(stderr, "dsv4-decode-bench: setup failed: %s\n", bench.status().ToString().c_str());
    return 1;
  }
  const RunInfo& info = (*bench)->info();
  const nlohmann::json run = RunJson(info, o);
  std::printf("# dsv4-decode-bench: %s, %s, %d layers, rank %d of %d, %s experts, %s routing, graphs %s, attention %s"
              "%s\n",
              info.device.c_str(), o.config_path.c_str(), info.layers, o.rank, o.world,
              std::string(ExpertFormatName(o.experts)).c_str(), o.routing.skewed ? "skewed" : "random",
              o.cuda_graphs && info.graphs ? "on" : "off", o.attention_kernel.c_str(),
              o.fuse_projections ? ", fused projections" : "");
  std::printf("copy bandwidth %.0f GB/s; synthetic weights %.1f s (%.2f GB host), load %.1f s, kv fill %.1f s, "
              "graph capture %.1f s; backend memory: weights %.1f GB, kv %.1f GB, workspace %.2f GB\n",
              info.copy_gbs, info.synth_seconds, info.synth_host_bytes / 1e9, info.load_seconds, info.fill_seconds,
              info.capture_seconds, info.backend_bytes[0] / 1e9, info.backend_bytes[1] / 1e9,
              info.backend_bytes[3] / 1e9);
  std::printf("per step: dense weights %.3f GB, one expert %.2f MB (%d held per layer)%s\n\n",
              info.weight_bytes.dense / 1e9, info.weight_bytes.per_expert / 1e6,
              static_cast<int>(info.weight_bytes.experts_held),
              o.routing.skewed ? absl::StrCat("; skew bias ", info.hot_bias).c_str() : "");
  std::printf("%s", TableHeader().c_str());
  std::fflush(stdout);
  std::vector<PointResult> points;
  int failures = 0;
  for (int64_t ctx : o.contexts) {
    for (int b : o.batches) {
      absl::StatusOr<PointResult> r = (*bench)->Run(b, ctx);
      if (!r.ok()) {
        std::printf("| %d | %lld | failed: %s |\n", b, static_cast<long long>(ctx), r.status().ToString().c_str());
        ++failures;
        continue;
      }
      points.push_back(*r);
      std::printf("%s", TableRow(*r, info.layers).c_str());
      std::fflush(stdout);
    }
  }
  std::printf("\nphase shares are of the GPU time of a timed step (gpu ms); * = experts touched estimated, not read "
              "from the device\n");
  for (const PointResult& r : points) {
    if (o.world > 1) {
      std::printf("batch %d context %lld: %lld all-reduces, %.2f MB payload (%.2f MB bus bytes per rank), %lld "
                  "gathers %.2f MB; modelled comm %.3f ms -> projected TPOT %.3f ms\n",
                  r.batch, static_cast<long long>(r.context), static_cast<long long>(r.all_reduces),
                  r.all_reduce_bytes / 1e6, 2.0 * (o.world - 1) / o.world * r.all_reduce_bytes / 1e6,
                  static_cast<long long>(r.gathers), r.gather_bytes / 1e6, r.comm_modelled_ms,
                  r.step_ms + r.comm_modelled_ms);
    }
    if (r.hot_share >= 0) std::printf("batch %d context %lld: hot experts took %.0f%% of the pairs\n", r.batch,
                                      static_cast<long long>(r.context), 100 * r.hot_share);
  }
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    if (absl::Status s = WriteJson(path, run, points, o.world); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      ++failures;
    }
  }
  if (const std::string path = absl::GetFlag(FLAGS_svg); !path.empty() && !points.empty()) {
    std::string title = absl::GetFlag(FLAGS_title);
    if (title.empty()) {
      title = absl::StrCat("dsv4-decode-bench: ", info.layers, " layers, rank ", o.rank, " of ", o.world, ", ",
                           std::string(ExpertFormatName(o.experts)), ", ", info.device);
    }
    if (absl::Status s = WriteSvg(path, title, points); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      ++failures;
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dsv4::bench

int main(int argc, char** argv) {
  // The documented spellings are --simulate-rank, --cuda-graphs, ...: absl flag names are identifiers, so '-' in a
  // name becomes '_' (as worker/main.cc does).
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> argp;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string& a = args[i];
    if (i > 0 && a.rfind("--", 0) == 0) {
      const size_t end = std::min(a.find('='), a.size());
      for (size_t j = 2; j < end; ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
    argp.push_back(a.data());
  }
  const std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(argp.size()), argp.data());
  if (rest.size() > 1) {
    std::fprintf(stderr, "unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  return dsv4::bench::Main();
}
