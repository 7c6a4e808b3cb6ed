// Tensor-parallel sharding (model/dsv4/shard.h): the layout for the real Flash dimensions and refusals, reading a
// rank's block of a linear from a real checkpoint in every weight format (kept in its format on block boundaries,
// dequantised off them; either way the blocks put together are exactly the full dequantised matrix), and the
// algebra the group relies on (partial outputs of the head-split attention projection, the expert-parallel MoE and
// the split shared expert sum to the unsharded result). The vocabulary gather is tested with the worker's
// collectives adapter (tests/worker/model_hooks_test.cc).
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "kernels/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "model/checkpoint/quantize.h"
#include "model/checkpoint/safetensors_writer.h"
#include "model/dsv4/shard.h"
#include "common/status_macros.h"

namespace dsv4::model {
namespace {

using ::testing::HasSubstr;

std::string MakeTempDir(const std::string& tag) {
  std::string templ = (std::filesystem::temp_directory_path() / ("dsv4-" + tag + "-XXXXXX")).string();
  return mkdtemp(templ.data()) != nullptr ? templ : std::string();
}

Config FlashDims() {
  Config c;  // defaults are DeepSeek-V4-Flash's
  c.num_attention_heads = 64;
  c.o_groups = 8;
  c.n_routed_experts = 256;
  c.moe_intermediate_size = 2048;
  c.n_shared_experts = 1;
  c.vocab_size = 129280;
  return c;
}

TEST(ShardLayoutTest, FlashSplitsEvenlyAndCoversEverything) {
  const Config c = FlashDims();
  for (int world : {1, 2, 4, 8}) {
    int64_t heads = 0, experts = 0, vocab = 0, inter = 0;
    for (int r = 0; r < world; ++r) {
      auto l = PlanShardLayout(c, {r, world});
      ASSERT_TRUE(l.ok()) << l.status();
      EXPECT_EQ(l->heads.begin, heads);
      EXPECT_EQ(l->experts.begin, experts);
      EXPECT_EQ(l->vocab.begin, vocab);
      EXPECT_EQ(l->shared_inter.begin, inter);
      // A rank's output groups hold exactly its heads.
      EXPECT_EQ(l->groups.begin * (c.num_attention_heads / c.o_groups), l->heads.begin);
      EXPECT_EQ(l->groups.size * (c.num_attention_heads / c.o_groups), l->heads.size);
      heads += l->heads.size;
      experts += l->experts.size;
      vocab += l->vocab.size;
      inter += l->shared_inter.size;
    }
    EXPECT_EQ(heads, 64);
    EXPECT_EQ(experts, 256);
    EXPECT_EQ(vocab, 129280);
    EXPECT_EQ(inter, 2048);
  }
}

// The tiny test config (8 heads, 2 output groups) at world 4: two ranks per group, each with its heads' columns.
TEST(ShardLayoutTest, MoreRanksThanOutputGroupsShareAGroup) {
  Config c = FlashDims();
  c.num_attention_heads = 8;
  c.o_groups = 2;
  c.head_dim = 512;
  c.n_routed_experts = 8;
  c.moe_intermediate_size = 256;
  const int64_t want_group[4] = {0, 0, 1, 1}, want_col[4] = {0, 1024, 0, 1024};
  for (int r = 0; r < 4; ++r) {
    auto l = PlanShardLayout(c, {r, 4});
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->groups.begin, want_group[r]);
    EXPECT_EQ(l->groups.size, 1);
    EXPECT_EQ(l->group_cols.begin, want_col[r]);
    EXPECT_EQ(l->group_cols.size, 1024);
  }
  c.o_groups = 4;
  c.num_attention_heads = 12;
  c.n_routed_experts = 12;
  c.moe_intermediate_size = 240;
  EXPECT_THAT(std::string(PlanShardLayout(c, {0, 6}).status().message()), HasSubstr("one must divide the other"));
}

TEST(ShardLayoutTest, RefusesUnevenSplitsNamingTheField) {
  const Config c = FlashDims();
  EXPECT_THAT(std::string(PlanShardLayout(c, {0, 3}).status().message()),
              HasSubstr("num_attention_heads 64 is not divisible by world 3"));
  Config d = c;
  d.n_routed_experts = 6;
  EXPECT_THAT(std::string(PlanShardLayout(d, {0, 4}).status().message()), HasSubstr("n_routed_experts 6"));
  EXPECT_EQ(PlanShardLayout(c, {4, 4}).status().code(), absl::StatusCode::kInvalidArgument);
  Config v = c;
  v.vocab_size = 10;  // ragged: 4 ranks hold 3, 3, 3, 1
  auto last = PlanShardLayout(v, {3, 4});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->vocab_slot, 3);
  EXPECT_EQ(last->vocab.begin, 9);
  EXPECT_EQ(last->vocab.size, 1);
}

// The dense fp32 matrix a block read holds, through the CPU backend: Linear of the identity gives W^T row by
// row exactly (every product is by 1 or 0).
absl::StatusOr<std::vector<float>> Dense(const ckpt::Checkpoint& ck, const std::string& name, int64_t n, int64_t k,
                                         Range rows, Range cols) {
  DSV4_ASSIGN_OR_RETURN(HostLinear h, ReadLinearBlock(ck, name, n, k, rows, cols));
  static std::unique_ptr<kernels::Backend> be = kernels::cpu::MakeCpuBackend(1);
  DSV4_ASSIGN_OR_RETURN(kernels::LinearHandle w, be->PrepareLinear(h.view));
  const int64_t N = rows.size, K = cols.size;
  DSV4_ASSIGN_OR_RETURN(kernels::Buffer eye, be->Allocate(K * K * 4, kernels::MemoryKind::kWorkspace));
  DSV4_ASSIGN_OR_RETURN(kernels::Buffer wt, be->Allocate(K * N * 4, kernels::MemoryKind::kWorkspace));
  for (int64_t i = 0; i < K; ++i) eye.as<float>()[i * K + i] = 1.f;
  be->ops().Linear({.w = w.get(), .x = {.data = eye.data()}, .y = wt.as<float>(), .t = K});
  DSV4_RETURN_IF_ERROR(be->Synchronize());
  std::vector<float> out(N * K);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < K; ++j) out[i * K + j] = wt.as<float>()[j * N + i];
  return out;
}

std::vector<float> RandomMatrix(int64_t n, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(n * k);
  for (auto& x : w) x = d(rng);
  return w;
}

TEST(ShardedLoadTest, ShardsReassembleTheFullMatrixInEveryFormat) {
  const std::string dir = MakeTempDir("shard");
  const int64_t n = 256, k = 384;
  const uint32_t seed = std::random_device{}();
  const std::vector<std::pair<ckpt::WeightFormat, std::string>> formats = {
      {ckpt::WeightFormat::kBF16, "bf16"}, {ckpt::WeightFormat::kFp8Block128, "fp8"},
      {ckpt::WeightFormat::kNvfp4, "nvfp4"}, {ckpt::WeightFormat::kMxfp4, "mxfp4"}};
  {
    auto writer = ckpt::CheckpointWriter::Create(dir, 1);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (const auto& [format, name] : formats) {
      auto q = ckpt::QuantizeLinear(format, RandomMatrix(n, k, seed), n, k);
      ASSERT_TRUE(q.ok()) << q.status();
      ASSERT_TRUE(ckpt::AddLinear(**writer, name, *q).ok());
    }
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  auto ck = ckpt::Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  for (const auto& [format, name] : formats) {
    auto w = ckpt::LoadLinearWeight(**ck, name);
    ASSERT_TRUE(w.ok());
    auto full = ckpt::Dequantize(*w);
    ASSERT_TRUE(full.ok());
    for (int world : {2, 4}) {
      std::vector<float> rows_joined, by_cols(n * k);
      for (int r = 0; r < world; ++r) {
        const Range rr{r * n / world, n / world}, cr{r * k / world, k / world};
        auto rows = Dense(**ck, name, n, k, rr, {0, k});
        auto cols = Dense(**ck, name, n, k, {0, n}, cr);
        ASSERT_TRUE(rows.ok() && cols.ok()) << name;
        rows_joined.insert(rows_joined.end(), rows->begin(), rows->end());
        for (int64_t i = 0; i < n; ++i) {
          std::copy_n(cols->data() + i * cr.size, cr.size, by_cols.data() + i * k + cr.begin);
        }
      }
      EXPECT_EQ(rows_joined, *full) << name << " world " << world << " (row shards)";
      // An interior block (rows and columns both cut mid-way through a 128 block).
      const Range br{70, 100}, bc{33, 200};
      auto block = Dense(**ck, name, n, k, br, bc);
      ASSERT_TRUE(block.ok()) << block.status();
      for (int64_t i = 0; i < br.size; ++i)
        for (int64_t j = 0; j < bc.size; ++j)
          ASSERT_EQ((*block)[i * bc.size + j], (*full)[(br.begin + i) * k + bc.begin + j]) << name << " " << i << "," << j;
      EXPECT_EQ(by_cols, *full) << name << " world " << world << " (column shards)";
    }
  }
  // Whole rows on block boundaries stay in the checkpoint format and point into the mapped file (no copy).
  auto fp8_rows = ReadLinearBlock(**ck, "fp8", n, k, {128, 128}, {0, k});
  ASSERT_TRUE(fp8_rows.ok());
  EXPECT_EQ(fp8_rows->view.format, kernels::WeightFormat::kFp8Block128);
  EXPECT_TRUE(fp8_rows->owned_data.empty());
  auto off_blocks = ReadLinearBlock(**ck, "fp8", n, k, {70, 100}, {0, k});
  ASSERT_TRUE(off_blocks.ok());
  EXPECT_EQ(off_blocks->view.format, kernels::WeightFormat::kF32);
  EXPECT_THAT(std::string(ReadLinearBlock(**ck, "bf16", n, k, {200, 100}, {0, k}).status().message()),
              HasSubstr("rows [200, 300) outside [0, 256)"));
  EXPECT_THAT(std::string(ReadLinearBlock(**ck, "bf16", n + 1, k, {0, 1}, {0, k}).status().message()),
              HasSubstr("expected a [257,384] linear"));
  std::filesystem::remove_all(dir);
}

// y = W x with W [n, k], x [k].
std::vector<double> MatVec(const std::vector<float>& w, int64_t n, int64_t k, const std::vector<double>& x,
                           int64_t col0 = 0, int64_t ld = -1) {
  if (ld < 0) ld = k;
  std::vector<double> y(n, 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < k; ++j) y[i] += w[i * ld + col0 + j] * x[j];
  return y;
}

double RelErr(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / den);
}

double Silu(double g) { return g / (1.0 + std::exp(-g)); }

// The grouped output projection and the MoE (routed + shared) on one token, unsharded and as the sum of every
// rank's partial output computed from its shard only, exactly as the sharded forward does before its all-reduce.
TEST(ShardAlgebraTest, PartialOutputsSumToTheUnshardedResult) {
  Config c;
  c.num_attention_heads = 8;
  c.head_dim = 16;
  c.o_groups = 4;
  c.o_lora_rank = 12;
  c.hidden_size = 24;
  c.n_routed_experts = 8;
  c.moe_intermediate_size = 24;
  c.n_shared_experts = 1;
  c.vocab_size = 50;
  const int64_t H = 8, Dh = 16, G = 4, OL = 12, D = 24, E = 8, I = 24;
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> o(H * Dh), a(D);
  for (auto& v : o) v = nd(rng);
  for (auto& v : a) v = nd(rng);
  const auto wo_a = RandomMatrix(G * OL, H * Dh / G, seed + 1), wo_b = RandomMatrix(D, G * OL, seed + 2);
  std::vector<std::vector<float>> w1, w3, w2;
  for (int64_t e = 0; e < E; ++e) {
    w1.push_back(RandomMatrix(I, D, seed + 10 + e));
    w3.push_back(RandomMatrix(I, D, seed + 30 + e));
    w2.push_back(RandomMatrix(D, I, seed + 50 + e));
  }
  const auto s1 = RandomMatrix(I, D, seed + 70), s3 = RandomMatrix(I, D, seed + 71), s2 = RandomMatrix(D, I, seed + 72);
  const std::vector<std::pair<int64_t, double>> routed = {{1, 0.5}, {6, 0.7}, {3, 0.3}};  // router output

  // Unsharded attention output: z_g = W_oa[g] O_g, y = W_ob z.
  const int64_t gin = H * Dh / G;
  std::vector<double> z(G * OL);
  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> og(o.begin() + g * gin, o.begin() + (g + 1) * gin);
    std::vector<float> wg(wo_a.begin() + g * OL * gin, wo_a.begin() + (g + 1) * OL * gin);
    const auto zg = MatVec(wg, OL, gin, og);
    std::copy(zg.begin(), zg.end(), z.begin() + g * OL);
  }
  const auto y_attn = MatVec(wo_b, D, G * OL, z);
  // Unsharded MoE: sum of weighted routed experts + shared expert.
  auto expert = [&](const std::vector<float>& a1, const std::vector<float>& a3, const std::vector<float>& a2,
                    int64_t i0, int64_t ni, double weight) {
    std::vector<double> h(ni);
    for (int64_t i = 0; i < ni; ++i) {
      double g = 0, v = 0;
      for (int64_t j = 0; j < D; ++j) {
        g += a1[(i0 + i) * D + j] * a[j];
        v += a3[(i0 + i) * D + j] * a[j];
      }
      h[i] = weight * Silu(std::min(g, 10.0)) * std::clamp(v, -10.0, 10.0);
    }
    return MatVec(a2, D, ni, h, i0, I);
  };
  std::vector<double> y_moe(D, 0.0);
  for (auto [e, wt] : routed) {
    const auto y = expert(w1[e], w3[e], w2[e], 0, I, wt);
    for (int64_t d = 0; d < D; ++d) y_moe[d] += y[d];
  }
  const auto ys = expert(s1, s3, s2, 0, I, 1.0);
  for (int64_t d = 0; d < D; ++d) y_moe[d] += ys[d];

  for (int world : {2, 4, 8}) {  // 8 > o_groups: ranks share a group
    std::vector<double> sum_attn(D, 0.0), sum_moe(D, 0.0);
    for (int r = 0; r < world; ++r) {
      auto l = PlanShardLayout(c, {r, world});
      ASSERT_TRUE(l.ok()) << l.status();
      // Attention: this rank's heads' outputs through its block of W_oa (whole groups, or its heads' columns of
      // one group when world > o_groups) and its groups' columns of W_ob.
      std::vector<double> z_local(l->groups.size * OL);
      for (int64_t g = 0; g < l->groups.size; ++g) {
        const int64_t gg = l->groups.begin + g;
        std::vector<double> og(o.begin() + gg * gin + l->group_cols.begin,
                               o.begin() + gg * gin + l->group_cols.end());
        std::vector<float> wg(wo_a.begin() + gg * OL * gin, wo_a.begin() + (gg + 1) * OL * gin);
        const auto zg = MatVec(wg, OL, l->group_cols.size, og, l->group_cols.begin, gin);
        std::copy(zg.begin(), zg.end(), z_local.begin() + g * OL);
      }
      const auto y_part = MatVec(wo_b, D, l->groups.size * OL, z_local, l->groups.begin * OL, G * OL);
      for (int64_t d = 0; d < D; ++d) sum_attn[d] += y_part[d];
      // MoE: only the local experts among the routed ones, plus this rank's slice of the shared expert.
      for (auto [e, wt] : routed) {
        if (e < l->experts.begin || e >= l->experts.end()) continue;
        const auto y = expert(w1[e], w3[e], w2[e], 0, I, wt);
        for (int64_t d = 0; d < D; ++d) sum_moe[d] += y[d];
      }
      const auto ysp = expert(s1, s3, s2, l->shared_inter.begin, l->shared_inter.size, 1.0);
      for (int64_t d = 0; d < D; ++d) sum_moe[d] += ysp[d];
    }
    EXPECT_LT(RelErr(sum_attn, y_attn), 1e-12) << "world " << world << " seed " << seed;
    EXPECT_LT(RelErr(sum_moe, y_moe), 1e-12) << "world " << world << " seed " << seed;
  }
}

TEST(ResidentBytesTest, ReportsThisProcess) { EXPECT_GT(ResidentBytes(), 1 << 20); }

}  // namespace
}  // namespace dsv4::model
