// dsv4-decode-bench end to end: the program runs, exits 0, and its JSON has every field with values that make sense
// (floors > 0 and the sum of their parts, phases adding up to the timed step and close to the step's wall time,
// every phase the config has measured). Built twice: DSV4_DECODE_BENCH_CPU runs configs/tiny.json on the CPU
// backend (CI); DSV4_DECODE_BENCH_GPU runs 4 flash layers as rank 1 of a simulated TP 4 on the GPU (label gpu;
// skipped without one).
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend_factory.h"
#include "nlohmann/json.hpp"

namespace dsv4::bench {
namespace {

std::string SourceDir() {
  const char* d = std::getenv("DSV4_SOURCE_DIR");
  return d != nullptr ? d : ".";
}

// The bench program: $DSV4_DECODE_BENCH_BIN, else under $DSV4_BINARY_DIR in the build layout (ctest; the
// gpu-tests bundle), else beside this test, else the build tree's.
std::string BenchBinary() {
  if (const char* env = std::getenv("DSV4_DECODE_BENCH_BIN"); env != nullptr && *env != 0) return env;
  if (const char* dir = std::getenv("DSV4_BINARY_DIR"); dir != nullptr && *dir != 0) {
    const std::filesystem::path p = std::filesystem::path(dir) / "bench/decode/dsv4-decode-bench";
    if (std::filesystem::exists(p)) return p.string();
  }
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && std::filesystem::exists(self.parent_path() / "dsv4-decode-bench")) {
    return (self.parent_path() / "dsv4-decode-bench").string();
  }
  return DSV4_DECODE_BENCH_BIN;
}

// Runs the bench with `args`; returns its JSON (and checks the exit status and the SVG).
nlohmann::json RunBench(const std::string& name, const std::string& args) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / absl::StrCat("decode_bench_", name, "_", ::getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string json = (dir / "out.json").string(), svg = (dir / "out.svg").string(), log = (dir / "log.txt").string();
  const std::string cmd = absl::StrCat(BenchBinary(), " ", args, " --json=", json, " --svg=", svg, " > ", log,
                                       " 2>&1");
  const int rc = std::system(cmd.c_str());
  std::ifstream lf(log);
  const std::string out((std::istreambuf_iterator<char>(lf)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  std::ifstream sf(svg);
  const std::string svg_text((std::istreambuf_iterator<char>(sf)), std::istreambuf_iterator<char>());
  EXPECT_NE(svg_text.find("<svg"), std::string::npos) << "no SVG written";
  EXPECT_NE(svg_text.find("<polyline"), std::string::npos) << "SVG without lines";
  std::ifstream jf(json);
  EXPECT_TRUE(jf.good()) << "no JSON written\n" << out;
  nlohmann::json j;
  if (jf.good()) j = nlohmann::json::parse(jf, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "JSON does not parse";
  std::printf("%s", out.c_str());
  std::filesystem::remove_all(dir, ec);
  return j;
}

double Num(const nlohmann::json& j, const std::string& path) {
  const nlohmann::json* at = &j;
  size_t from = 0;
  while (from <= path.size()) {
    const size_t dot = std::min(path.find('.', from), path.size());
    const std::string key = path.substr(from, dot - from);
    if (!at->is_object() || !at->contains(key)) {
      ADD_FAILURE() << "missing field " << path;
      return std::nan("");
    }
    at = &(*at)[key];
    from = dot + 1;
  }
  if (!at->is_number()) {
    ADD_FAILURE() << path << " is not a number: " << at->dump();
    return std::nan("");
  }
  return at->get<double>();
}

// Checks every point; `indexer`: the config has ratio-4 layers; `graphs`: phases from a graph replay.
void CheckPoints(const nlohmann::json& j, size_t points, bool indexer, bool graphs, int world) {
  ASSERT_TRUE(j.contains("points") && j["points"].is_array());
  ASSERT_EQ(j["points"].size(), points);
  for (const char* f : {"run.layers", "run.copy_gbs", "run.weight_bytes.dense_per_step", "run.weight_bytes.per_expert",
                        "run.seconds.load", "run.backend_bytes.weights"}) {
    EXPECT_GT(Num(j, f), 0) << f;
  }
  const int layers = static_cast<int>(Num(j, "run.layers"));
  for (const nlohmann::json& p : j["points"]) {
    SCOPED_TRACE(p.dump());
    for (const char* f : {"batch", "context", "step_ms", "tokens_per_s", "gpu_ms", "ms_per_layer", "floor.bytes",
                          "floor.ms", "floor.weight_bytes", "floor.expert_bytes", "floor.kv_bytes", "pct_of_floor",
                          "bytes_moved", "achieved_gbs", "routing.experts_touched_per_layer", "host_ms.prepare",
                          "host_ms.finish", "phase_ms.attention", "phase_ms.moe", "phase_ms.dense"}) {
      EXPECT_GT(Num(p, f), 0) << f;
    }
    for (const char* f : {"phase_ms.indexer", "phase_ms.comm", "phase_ms.other", "phase_share.attention",
                          "phase_share.indexer", "phase_share.moe", "phase_share.dense", "phase_share.comm",
                          "phase_share.other", "floor.indexer_bytes", "graph_nodes", "graph_nodes_per_layer",
                          "comm.all_reduces", "comm.all_reduce_bytes", "comm.modelled_ms", "step_p10_ms",
                          "step_p90_ms", "host_ms.launch", "routing.hot_share"}) {
      EXPECT_GE(Num(p, f), f == std::string("routing.hot_share") ? -1 : 0) << f;
    }
    if (indexer) {
      EXPECT_GT(Num(p, "phase_ms.indexer"), 0);
      EXPECT_GT(Num(p, "floor.indexer_bytes"), 0);
    }
    // The floor is the sum of its parts, and its time is bytes over the copy bandwidth.
    const double parts = Num(p, "floor.weight_bytes") + Num(p, "floor.expert_bytes") + Num(p, "floor.kv_bytes") +
                         Num(p, "floor.indexer_bytes");
    EXPECT_NEAR(Num(p, "floor.bytes"), parts, 1e-6 * parts);
    EXPECT_NEAR(Num(p, "floor.ms"), Num(p, "floor.bytes") / (Num(j, "run.copy_gbs") * 1e9) * 1e3,
                1e-6 * Num(p, "floor.ms"));
    // Phases add up to the timed step, and the timed step is about the measured step (the step adds host work:
    // plan packing and copies; the phase split is of one timed step).
    double sum = 0, shares = 0;
    for (const char* ph : {"attention", "indexer", "moe", "dense", "comm", "other"}) {
      sum += Num(p, absl::StrCat("phase_ms.", ph));
      shares += Num(p, absl::StrCat("phase_share.", ph));
    }
    EXPECT_NEAR(sum, Num(p, "gpu_ms"), 1e-6 * sum);
    EXPECT_NEAR(shares, 1.0, 1e-6);
    // The timed step is one step; step_ms is a median. On the CPU backend of a loaded 2-core CI machine one step
    // has taken 1.7x the median (11.4 vs 6.7 ms), so the CPU build allows 3x; the GPU's steps vary by a few percent.
#if defined(DSV4_DECODE_BENCH_CPU)
    constexpr double kOneStepSlack = 3.0;
#else
    constexpr double kOneStepSlack = 1.5;
#endif
    EXPECT_GT(Num(p, "gpu_ms"), 0.3 * Num(p, "step_ms"));
    EXPECT_LT(Num(p, "gpu_ms"), kOneStepSlack * Num(p, "step_ms"));
    EXPECT_NEAR(Num(p, "ms_per_layer") * layers, Num(p, "step_ms"), 1e-6 * Num(p, "step_ms"));
    EXPECT_EQ(p.value("phase_source", ""), graphs ? "graph replay" : "eager");
    if (graphs) {
      EXPECT_GT(Num(p, "graph_nodes"), 10 * layers);
    }
    if (world > 1) {
      EXPECT_EQ(Num(p, "comm.all_reduces"), 2 * layers);  // after attention and after the MoE of every layer
      EXPECT_GT(Num(p, "comm.gathers"), 0);
      EXPECT_GT(Num(p, "projected_tpot_ms"), Num(p, "step_ms"));
    }
  }
}

#if defined(DSV4_DECODE_BENCH_CPU)
TEST(DecodeBenchCpu, TinyConfigEveryField) {
  const nlohmann::json j = RunBench(
      "cpu", absl::StrCat("--backend=cpu --threads=2 --config=", SourceDir(),
                          "/configs/tiny.json --layers=all --batches=1,2 --context=64,256 --warmup=1 --reps=2 "
                          "--phase_reps=1 --routing=skewed"));
  CheckPoints(j, 4, /*indexer=*/true, /*graphs=*/false, /*world=*/1);
  if (j.contains("points") && j["points"].size() == 4) {
    // Cost grows with context as the floor does: same batch, 4x the context -> more KV and indexer bytes.
    EXPECT_GT(j["points"][2]["floor"]["indexer_bytes"].get<double>(), j["points"][0]["floor"]["indexer_bytes"].get<double>());
  }
}

TEST(DecodeBenchCpu, SimulatedRankCountsCollectives) {
  const nlohmann::json j = RunBench(
      "cpu_tp", absl::StrCat("--backend=cpu --threads=2 --config=", SourceDir(),
                             "/configs/tiny.json --layers=all --batches=2 --context=64 --warmup=1 --reps=2 "
                             "--phase_reps=1 --simulate-rank=1 --simulate-world=2 --comm-busbw-gbs=100 "
                             "--comm-latency-us=10"));
  CheckPoints(j, 1, /*indexer=*/true, /*graphs=*/false, /*world=*/2);
}
#endif

#if defined(DSV4_DECODE_BENCH_GPU)
TEST(DecodeBenchGpu, FlashShapesSmoke) {
  if (!kernels::MakeBackend({.name = "cuda"}).ok()) GTEST_SKIP() << "no usable CUDA device";
  const nlohmann::json j = RunBench(
      "gpu", absl::StrCat("--config=", SourceDir(),
                          "/configs/flash.json --layers=4 --simulate-rank=1 --simulate-world=4 --batches=1,8 "
                          "--context=1024 --warmup=2 --reps=3 --comm-busbw-gbs=300 --comm-latency-us=10"));
  CheckPoints(j, 2, /*indexer=*/true, /*graphs=*/true, /*world=*/4);
  for (const nlohmann::json& p : j.value("points", nlohmann::json::array())) {
    EXPECT_TRUE(p["routing"]["measured"].get<bool>());
  }
}
#endif

}  // namespace
}  // namespace dsv4::bench
