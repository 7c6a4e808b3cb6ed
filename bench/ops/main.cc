// dsv4-ops-bench: times every op of the CUDA backend at the decode shapes of configs/flash.json under CUDA-graph
// replay (issue 13's op timing table). Per op and shape it prints the median time of --reps replays (inputs rotated
// through more memory than the L2), the bytes the op must move, GB/s and the percentage of the device-to-device
// copy bandwidth measured at the start of the same run, as markdown tables on stdout, and writes every result to
// a JSON file (--json). Weights, experts and KV pools are synthetic but valid, built through the backend
// (PrepareLinear / PrepareExperts from host bytes, FP8 rows from the real encoder): no checkpoint is read.
// docs/cuda-backend.md ("Measuring the ops") explains the columns and the method.
//
//   dsv4-ops-bench                      the default sweep (about 2 minutes on an H200)
//   dsv4-ops-bench --full               every T / B / context of the issue (more replays)
//   dsv4-ops-bench --smoke              the smallest shape of each op once (graph captured, outputs checked)
//   dsv4-ops-bench --tp=4               one rank of TP 4: 16 heads, 2 output groups, 64 experts, shared width 512
//   dsv4-ops-bench --only=indexer,moe   some families (linear, moe, indexer, attention, dense, cache)
//   dsv4-ops-bench --backend=cpu        the harness on the CPU backend (implies --smoke; no GPU needed)
// Exit status: 0 when every case ran and passed its check, 1 otherwise.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/ops/bench.h"
#include "bench/ops/flag_lists.h"
#include "kernels/backend_factory.h"
#include "model/config/config.h"

ABSL_FLAG(std::string, backend, "cuda", "cuda | cpu (cpu: a harness check without a GPU; implies --smoke)");
ABSL_FLAG(int, device, 0, "CUDA device");
ABSL_FLAG(std::string, config, "", "config.json of the model (empty: configs/flash.json's values)");
ABSL_FLAG(int, tp, 1, "tensor-parallel world: time one rank's shard (heads, groups, experts, shared width, vocab)");
ABSL_FLAG(int, heads, 0, "attention heads of the rank (0: from --tp)");
ABSL_FLAG(int, experts, 0, "routed experts held by the rank (0: from --tp; cpu default 8)");
ABSL_FLAG(int, shared_inter, 0, "shared-expert width of the rank (0: from --tp)");
ABSL_FLAG(int, vocab_rows, 0, "head rows of the rank (0: from --tp)");
ABSL_FLAG(bool, full, false, "every size of the issue: T and B = 1, 2, 4, ..., 128, three attention contexts");
ABSL_FLAG(bool, smoke, false, "the smallest shape of each op, one graph replay, outputs checked");
ABSL_FLAG(bool, cpu_sweep, false, "with --backend=cpu: run the sweep, not the smoke (slow; give small size lists)");
ABSL_FLAG(std::string, only, "", "comma-separated families (linear, moe, indexer, attention, dense, cache); empty: all");
ABSL_FLAG(std::string, tokens, "", "T of the linears (default 1,8,32,64,128)");
ABSL_FLAG(std::string, moe_tokens, "", "T of the MoE (default 1,8,32,128; --full 1..128)");
ABSL_FLAG(std::string, moe_formats, "NVFP4,MXFP4", "routed expert formats");
ABSL_FLAG(std::string, moe_routing, "random,skewed",
          "routings of the routed-experts-only cases (cuda): random (score routing), skewed (20% of the experts "
          "get 80% of the picks, hash routing); empty: none");
ABSL_FLAG(bool, moe_whole, true, "also time the whole MoE op (shared expert included)");
ABSL_FLAG(std::string, dense_tokens, "", "T of the dense and cache ops (default 1,8,32,128; --full 1..128)");
ABSL_FLAG(std::string, attention_batches, "", "B of attention (default 1,8,32,128; --full 1..128)");
ABSL_FLAG(std::string, attention_contexts, "", "contexts of ratio-128 attention (default 32768; --full 8192,32768,131072)");
ABSL_FLAG(std::string, attention_kernels, "mma,simt", "sparse-MLA kernels (a backend each)");
ABSL_FLAG(std::string, indexer_batches, "", "B of the indexer (default 1,32,64)");
ABSL_FLAG(std::string, indexer_contexts, "", "contexts of the indexer (default 8192,32768,131072)");
ABSL_FLAG(std::string, indexer_pool8x, "", "B of the 8x-pool indexer cases at the first context (default 1,64)");
ABSL_FLAG(int64_t, max_context, 131072, "planned max context (Reserve, indexer row bound, ratio-128 bound)");
ABSL_FLAG(int, reps, 0, "timed replays per case (0: 50, --full 100)");
ABSL_FLAG(int, warmup, 3, "untimed replays before them");
ABSL_FLAG(double, rotate_mb, 256, "streamed data cycled per replay (weights, KV rows, state), MB");
ABSL_FLAG(int, max_sets, 2048, "most input sets per case");
ABSL_FLAG(double, replay_budget_ms, 25, "sets are capped so that one replay takes about this long");
ABSL_FLAG(std::string, json, "dsv4_ops_bench.json", "JSON file of every result (empty: none)");
ABSL_FLAG(std::string, tag, "", "free text recorded in the JSON file (e.g. the commit)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the synthetic data");

namespace dsv4::bench {
namespace {

// The flag's list, or `fallback` when the flag is empty; a bad item ends the program (exit 2).
std::vector<int64_t> ParseList(const std::string& flag, const std::string& text, std::vector<int64_t> fallback) {
  if (text.empty()) return fallback;
  absl::StatusOr<std::vector<int64_t>> list = ParsePositiveList(flag, text);
  if (!list.ok()) {
    std::fprintf(stderr, "%s\n", std::string(list.status().message()).c_str());
    std::exit(2);
  }
  return *std::move(list);
}

std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) out.emplace_back(part);
  return out;
}

absl::StatusOr<Config> ReadConfig(const std::string& path) {
  if (path.empty()) return Config{};  // its defaults are configs/flash.json's sizes
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return ParseConfig(text.str());
}

// One rank's shapes: the config divided by the TP world, or the explicit overrides.
Shapes MakeShapes(const Config& c, bool cpu) {
  const int tp = std::max(1, absl::GetFlag(FLAGS_tp));
  Shapes s;
  s.hidden = c.hidden_size;
  s.hc = c.hc_mult;
  s.heads = absl::GetFlag(FLAGS_heads) > 0 ? absl::GetFlag(FLAGS_heads) : c.num_attention_heads / tp;
  s.head_dim = c.head_dim;
  s.q_lora = c.q_lora_rank;
  s.o_lora = c.o_lora_rank;
  // Output groups of the rank: whole groups while the world divides them, else one group of the rank's heads.
  s.groups = std::max<int64_t>(1, c.o_groups * s.heads / c.num_attention_heads);
  s.group_in = s.heads / s.groups * c.head_dim;
  s.window = c.sliding_window;
  s.index_heads = c.index_n_heads;
  s.index_dim = c.index_head_dim;
  s.index_topk = c.index_topk;
  s.experts = c.n_routed_experts;
  s.experts_held = absl::GetFlag(FLAGS_experts) > 0 ? absl::GetFlag(FLAGS_experts)
                                                    : (cpu ? 8 : c.n_routed_experts / tp);
  s.topk = c.num_experts_per_tok;
  s.moe_inter = c.moe_intermediate_size;
  s.shared_inter = absl::GetFlag(FLAGS_shared_inter) > 0 ? absl::GetFlag(FLAGS_shared_inter)
                                                         : c.moe_intermediate_size * c.n_shared_experts / tp;
  s.vocab_rows = absl::GetFlag(FLAGS_vocab_rows) > 0 ? absl::GetFlag(FLAGS_vocab_rows) : (c.vocab_size + tp - 1) / tp;
  s.rope_pairs = static_cast<int>(c.qk_rope_head_dim / 2);
  s.rope_theta = c.rope_theta;
  s.compress_rope_theta = c.compress_rope_theta;
  s.sinkhorn_iters = static_cast<int>(c.hc_sinkhorn_iters);
  s.eps = static_cast<float>(c.rms_norm_eps);
  s.hc_eps = static_cast<float>(c.hc_eps);
  s.routed_scale = static_cast<float>(c.routed_scaling_factor);
  s.swiglu_limit = static_cast<float>(c.swiglu_limit);
  s.max_context = absl::GetFlag(FLAGS_max_context);
  return s;
}

Sweep MakeSweep(bool full, bool smoke) {
  const std::vector<int64_t> pow2 = {1, 2, 4, 8, 16, 32, 64, 128}, some = {1, 8, 32, 128}, one = {1};
  const std::vector<int64_t>& sizes = smoke ? one : full ? pow2 : some;
  Sweep w;
  w.linear_tokens = ParseList("tokens", absl::GetFlag(FLAGS_tokens), smoke ? one : std::vector<int64_t>{1, 8, 32, 64, 128});
  w.moe_tokens = ParseList("moe_tokens", absl::GetFlag(FLAGS_moe_tokens), sizes);
  w.moe_formats = Words(absl::GetFlag(FLAGS_moe_formats));
  w.moe_routings = Words(absl::GetFlag(FLAGS_moe_routing));
  w.moe_whole = absl::GetFlag(FLAGS_moe_whole);
  w.dense_tokens = ParseList("dense_tokens", absl::GetFlag(FLAGS_dense_tokens), sizes);
  w.attention_batches = ParseList("attention_batches", absl::GetFlag(FLAGS_attention_batches), sizes);
  w.attention_contexts =
      ParseList("attention_contexts", absl::GetFlag(FLAGS_attention_contexts),
                smoke ? std::vector<int64_t>{8192}
                      : full ? std::vector<int64_t>{32768, 8192, 131072} : std::vector<int64_t>{32768});
  w.attention_kernels = Words(absl::GetFlag(FLAGS_attention_kernels));
  w.indexer_batches = ParseList("indexer_batches", absl::GetFlag(FLAGS_indexer_batches),
                                smoke ? one : std::vector<int64_t>{1, 32, 64});
  w.indexer_contexts = ParseList("indexer_contexts", absl::GetFlag(FLAGS_indexer_contexts),
                                 smoke ? std::vector<int64_t>{8192} : std::vector<int64_t>{8192, 32768, 131072});
  w.indexer_pool8x_batches = ParseList("indexer_pool8x", absl::GetFlag(FLAGS_indexer_pool8x),
                               smoke ? one : full ? std::vector<int64_t>{1, 32, 64} : std::vector<int64_t>{1, 64});
  return w;
}

int64_t Largest(std::initializer_list<const std::vector<int64_t>*> lists) {
  int64_t m = 1;
  for (const std::vector<int64_t>* l : lists) {
    for (int64_t v : *l) m = std::max(m, v);
  }
  return m;
}

std::string Now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

int Main() {
  const auto start = std::chrono::steady_clock::now();
  struct Family {
    const char* name;
    void (*run)(Bench&);
  };
  const Family families[] = {{"linear", RunLinearCases}, {"moe", RunMoeCases},       {"indexer", RunIndexerCases},
                             {"attention", RunAttentionCases}, {"dense", RunDenseCases}, {"cache", RunCacheCases}};
  const std::vector<std::string> only = Words(absl::GetFlag(FLAGS_only));
  for (const std::string& name : only) {
    if (std::none_of(std::begin(families), std::end(families), [&](const Family& f) { return name == f.name; })) {
      std::fprintf(stderr, "--only: unknown family '%s'\n", name.c_str());
      return 2;
    }
  }
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  const bool cpu = backend_name == "cpu";
  const bool full = absl::GetFlag(FLAGS_full);
  const bool smoke = absl::GetFlag(FLAGS_smoke) || (cpu && !absl::GetFlag(FLAGS_cpu_sweep));
  absl::StatusOr<Config> config = ReadConfig(absl::GetFlag(FLAGS_config));
  if (!config.ok()) {
    std::fprintf(stderr, "config: %s\n", config.status().ToString().c_str());
    return 2;
  }
  const Shapes shapes = MakeShapes(*config, cpu);
  const Sweep sweep = MakeSweep(full, smoke);
  for (const std::vector<int64_t>* contexts : {&sweep.attention_contexts, &sweep.indexer_contexts}) {
    for (int64_t ctx : *contexts) {
      if (ctx > shapes.max_context) {  // the ops' row bounds come from it (the model's contract)
        std::fprintf(stderr, "context %lld is above --max_context %lld\n", static_cast<long long>(ctx),
                     static_cast<long long>(shapes.max_context));
        return 2;
      }
    }
  }
  absl::StatusOr<std::unique_ptr<kernels::Backend>> made =
      kernels::MakeBackend({.name = backend_name, .device = absl::GetFlag(FLAGS_device), .attention_kernel = "mma"});
  if (!made.ok()) {
    std::fprintf(stderr, "backend: %s\n", made.status().ToString().c_str());
    return 2;
  }
  kernels::Backend& backend = **made;
  const int64_t max_t = Largest({&sweep.linear_tokens, &sweep.moe_tokens, &sweep.dense_tokens, &sweep.attention_batches,
                                 &sweep.indexer_batches});
  const kernels::StepLimits limits{.max_tokens = max_t, .max_seqs = max_t, .max_context = shapes.max_context,
                                   .hidden = shapes.hidden, .hc_mult = shapes.hc, .heads = shapes.heads,
                                   .head_dim = shapes.head_dim, .window = shapes.window,
                                   .index_heads = shapes.index_heads, .index_dim = shapes.index_dim,
                                   .index_topk = shapes.index_topk, .experts = shapes.experts,
                                   .experts_per_token = shapes.topk, .moe_inter = shapes.moe_inter,
                                   .shared_inter = shapes.shared_inter, .vocab = shapes.vocab_rows};
  if (absl::Status s = backend.Reserve(limits); !s.ok()) {
    std::fprintf(stderr, "Reserve: %s\n", s.ToString().c_str());
    return 2;
  }
  const DeviceInfo device = GetDeviceInfo(backend);
  absl::StatusOr<double> copy_bw = MeasureCopyBandwidth(backend, int64_t{1} << 30);
  if (!copy_bw.ok()) {
    std::fprintf(stderr, "copy bandwidth: %s\n", copy_bw.status().ToString().c_str());
    return 2;
  }
  const int reps = absl::GetFlag(FLAGS_reps) > 0 ? absl::GetFlag(FLAGS_reps) : (full ? 100 : 50);
  const RunOptions run{.reps = reps, .warmup = absl::GetFlag(FLAGS_warmup),
                       .replay_budget_s = absl::GetFlag(FLAGS_replay_budget_ms) * 1e-3, .smoke = smoke};
  std::printf("# dsv4-ops-bench on %s (%s)\n\n", device.name.c_str(), backend.name().c_str());
  std::printf("%s: %.0f GB/s (read + written bytes); L2 %.0f MB. "
              "Shapes of one rank: H=%lld G=%lld, %lld of %lld experts, shared width %lld, %lld head rows. "
              "%s, %d replays per case%s.\n",
              cpu ? "Host memcpy of 256 MiB" : "Device-to-device copy of 1 GiB (cudaMemcpyAsync)", *copy_bw / 1e9,
              device.l2_bytes / 1e6, static_cast<long long>(shapes.heads),
              static_cast<long long>(shapes.groups), static_cast<long long>(shapes.experts_held),
              static_cast<long long>(shapes.experts), static_cast<long long>(shapes.shared_inter),
              static_cast<long long>(shapes.vocab_rows), smoke ? "smoke" : full ? "full sweep" : "default sweep",
              smoke ? 1 : reps, cpu ? " (CPU backend: host time, a harness check only)" : "");
  const nlohmann::json meta = {
      {"date", Now()},
      {"tag", absl::GetFlag(FLAGS_tag)},
      {"device", device.name},
      {"backend", backend.name()},
      {"l2_bytes", device.l2_bytes},
      {"sms", device.sms},
      {"copy_gb_per_s", *copy_bw / 1e9},
      {"mode", smoke ? "smoke" : full ? "full" : "default"},
      {"reps", smoke ? 1 : reps},
      {"warmup", smoke ? 0 : run.warmup},
      {"rotate_mb", absl::GetFlag(FLAGS_rotate_mb)},
      {"replay_budget_ms", absl::GetFlag(FLAGS_replay_budget_ms)},
      {"shapes",
       {{"hidden", shapes.hidden}, {"heads", shapes.heads}, {"groups", shapes.groups}, {"group_in", shapes.group_in},
        {"experts", shapes.experts}, {"experts_held", shapes.experts_held}, {"shared_inter", shapes.shared_inter},
        {"vocab_rows", shapes.vocab_rows}, {"max_context", shapes.max_context}, {"page_rows", shapes.page_rows}}}};
  Report report(absl::GetFlag(FLAGS_json), meta);
  Runner runner(run, *copy_bw, device.l2_bytes);
  Bench bench{.backend = backend, .cuda = !cpu, .limits = limits, .shapes = shapes, .sweep = sweep,
              .runner = runner, .report = report, .rotate_bytes = absl::GetFlag(FLAGS_rotate_mb) * 1e6,
              .max_sets = std::max(1, absl::GetFlag(FLAGS_max_sets)), .seed = absl::GetFlag(FLAGS_seed)};

  for (const Family& f : families) {
    if (!only.empty() && std::find(only.begin(), only.end(), f.name) == only.end()) continue;
    const auto t0 = std::chrono::steady_clock::now();
    f.run(bench);
    std::fprintf(stderr, "[%s done in %.1f s]\n", f.name,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (absl::Status s = report.WriteJson(); !s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  }
  absl::StatusOr<double> copy_end = MeasureCopyBandwidth(backend, int64_t{1} << 30);
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report.Note(absl::StrFormat("%d cases, %d failed; copy bandwidth at the end %.0f GB/s; %.1f s in all.",
                              static_cast<int>(report.results().size()), report.failures(),
                              copy_end.ok() ? *copy_end / 1e9 : 0.0, total_s));
  report.Flush();
  if (absl::Status s = report.WriteJson(); !s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return report.failures() == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dsv4::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dsv4::bench::Main();
}
