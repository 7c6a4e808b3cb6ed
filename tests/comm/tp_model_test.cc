// The real model across tensor-parallel CPU groups of separate processes (tp_model_peer over Gloo on loopback):
// on the golden prompts (tests/data/golden, 320+ tokens: past the 128-token window and two ratio-128 rows), world
// 2 and world 4 must generate the same greedy tokens as world 1 and every position's logits must agree within
// 1e-4 relative (by norm, per row). The tiny checkpoint (configs/tiny.json, seed 1) is generated once here.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "comm/tcp_store.h"
#include "tests/comm/subprocess.h"
#include "tools/generate/npy.h"
#include "tools/make_checkpoint/generator.h"

namespace dsv4::comm {
namespace {

using std::chrono::milliseconds;
using testing::MakeTempDir;
using testing::Subprocess;

std::string SourceDir() {
  const char* s = std::getenv("DSV4_SOURCE_DIR");
  return s != nullptr ? s : DSV4_TEST_SOURCE_DIR;
}

struct RunResult {
  std::vector<float> logits;  // [rows, vocab]
  int64_t rows = 0, vocab = 0;
  std::string tokens;
  std::vector<int64_t> positions;  // lock-step runs: the position of each logits row
};

class TpModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(MakeTempDir("tp-model"));
    std::ifstream in(SourceDir() + "/configs/tiny.json");
    std::stringstream json;
    json << in.rdbuf();
    gen::GeneratorOptions o{.seed = 1, .out_dir = *dir_ + "/ckpt", .overwrite = true};
    auto summary = gen::GenerateCheckpoint(json.str(), o);
    ASSERT_TRUE(summary.ok()) << summary.status();
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }

  // The golden sequence's prompt, written as a token file for the peers.
  static std::string PromptFile(int seq) {
    const std::string golden = SourceDir() + "/tests/data/golden/";
    std::ifstream meta_in(golden + "golden.json");
    const auto meta = nlohmann::json::parse(meta_in);
    auto tokens = npy::Read(golden + "tokens.npy");
    EXPECT_TRUE(tokens.ok()) << tokens.status();
    int64_t row = 0;
    for (int i = 0; i < seq; ++i) row += meta["sequences"][i]["rows"].get<int64_t>();
    const int64_t len = meta["sequences"][seq]["prompt_len"].get<int64_t>();
    const std::string path = absl::StrCat(*dir_, "/prompt", seq, ".txt");
    std::ofstream out(path);
    for (int64_t r = row; r < row + len; ++r) out << tokens->as<int32_t>()[r] << " ";
    return path;
  }

  static RunResult RunWorld(int world, const std::string& prompt, int max_new, bool lockstep = false) {
    auto server = TcpStoreServer::Start("127.0.0.1", 0);
    EXPECT_TRUE(server.ok());
    const std::string out = absl::StrCat(*dir_, "/world", world, lockstep ? "-lockstep" : "");
    std::vector<Subprocess> peers;
    for (int r = 0; r < world; ++r) {
      peers.push_back(Subprocess::Start(
          {DSV4_TP_MODEL_PEER, absl::StrCat("--rank=", r), absl::StrCat("--world=", world),
           "--store=" + (*server)->Address(), "--checkpoint=" + *dir_ + "/ckpt", "--prompt=" + prompt,
           absl::StrCat("--max_new=", max_new), "--out=" + out, lockstep ? "--lockstep" : "--nolockstep"},
          absl::StrCat(out, ".rank", r, ".log")));
    }
    for (int r = 0; r < world; ++r) {
      const auto code = peers[r].Wait(milliseconds(240'000));
      EXPECT_TRUE(code.has_value()) << "world " << world << " rank " << r << " timed out:\n" << peers[r].Output();
      EXPECT_EQ(code.value_or(-1), 0) << "world " << world << " rank " << r << ":\n" << peers[r].Output();
      std::printf("%s", peers[r].Output().c_str());
    }
    RunResult res;
    auto logits = npy::Read(out + ".logits.npy");
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (logits.ok()) {
      res.rows = logits->shape[0];
      res.vocab = logits->shape[1];
      res.logits.assign(logits->as<float>(), logits->as<float>() + logits->numel());
    }
    std::ifstream t(out + ".tokens");
    std::getline(t, res.tokens);
    std::ifstream p(out + ".positions");
    for (int64_t pos; p >> pos;) res.positions.push_back(pos);
    return res;
  }

  static std::string* dir_;
};
std::string* TpModelTest::dir_ = nullptr;

void ExpectSameAsWorld1(const RunResult& one, const RunResult& tp, int world) {
  EXPECT_EQ(tp.tokens, one.tokens) << "world " << world << " greedy tokens differ from world 1";
  ASSERT_EQ(tp.rows, one.rows);
  ASSERT_EQ(tp.vocab, one.vocab);
  double worst = 0;
  int64_t worst_row = -1;
  for (int64_t r = 0; r < one.rows; ++r) {
    double num = 0, den = 0;
    for (int64_t v = 0; v < one.vocab; ++v) {
      const double a = tp.logits[r * one.vocab + v], b = one.logits[r * one.vocab + v];
      ASSERT_FALSE(std::isnan(a)) << "NaN at row " << r << " vocab " << v;
      num += (a - b) * (a - b);
      den += b * b;
    }
    const double rel = std::sqrt(num / den);
    if (rel > worst) {
      worst = rel;
      worst_row = r;
    }
  }
  std::printf("world %d vs world 1: %lld rows, worst relative logit error %.3e at row %lld, tokens %s\n", world,
              static_cast<long long>(one.rows), worst, static_cast<long long>(worst_row), tp.tokens.c_str());
  EXPECT_LE(worst, 1e-4) << "world " << world << " row " << worst_row;
}

TEST_F(TpModelTest, World2And4MatchWorld1OnAGoldenPrompt) {
  const std::string prompt = PromptFile(0);
  const RunResult one = RunWorld(1, prompt, 8);
  ASSERT_GT(one.rows, 320);
  for (int world : {2, 4}) ExpectSameAsWorld1(one, RunWorld(world, prompt, 8), world);
}

}  // namespace
}  // namespace dsv4::comm

namespace dsv4::comm {
namespace {

// The deployment path: rank 0 drives the sharded model through LockstepLeader (every call a broadcast StepPlan),
// ranks 1..3 only replay plans in RunFollower. Same tokens, same logits at every step's last position.
TEST_F(TpModelTest, LockstepWorld4MatchesWorld1) {
  const std::string prompt = PromptFile(1);
  const RunResult one = RunWorld(1, prompt, 8);
  const RunResult tp = RunWorld(4, prompt, 8, /*lockstep=*/true);
  EXPECT_EQ(tp.tokens, one.tokens);
  ASSERT_EQ(static_cast<int64_t>(tp.positions.size()), tp.rows);
  ASSERT_GT(tp.rows, 8);
  double worst = 0;
  for (int64_t i = 0; i < tp.rows; ++i) {
    const int64_t pos = tp.positions[i];
    ASSERT_LT(pos, one.rows);
    double num = 0, den = 0;
    for (int64_t v = 0; v < one.vocab; ++v) {
      const double a = tp.logits[i * one.vocab + v], b = one.logits[pos * one.vocab + v];
      ASSERT_FALSE(std::isnan(a));
      num += (a - b) * (a - b);
      den += b * b;
    }
    worst = std::max(worst, std::sqrt(num / den));
  }
  std::printf("lock-step world 4 vs world 1: %lld steps, worst relative logit error %.3e\n",
              static_cast<long long>(tp.rows), worst);
  EXPECT_LE(worst, 1e-4);
}

}  // namespace
}  // namespace dsv4::comm
