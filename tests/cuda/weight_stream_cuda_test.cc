// The streamed weight loader on the CUDA backend (model/dsv4/weights.h): the weights it leaves in device memory
// - every linear's data and scales, every layer's repacked experts and their tables, every plain tensor - are byte
// for byte those of the mapped loader, for the whole tiny model (NVFP4 and MXFP4 experts) and for rank 1 of a
// 2-way shard; the staging (pinned host memory) is freed after the load. Label gpu; skips without a GPU.
#include <cuda_runtime_api.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend_factory.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/moe_internal.h"
#include "model/config/config.h"
#include "model/dsv4/weights.h"
#include "tests/model/model_fixture.h"
#include "tools/make_checkpoint/generator.h"

namespace dsv4::model::testing {
namespace {

bool HaveGpu(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    *why = std::string("no usable CUDA device (") + (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")";
    return false;
  }
  return true;
}

std::string DeviceBytes(const void* p, int64_t bytes) {
  std::string s(static_cast<size_t>(bytes), '\0');
  if (bytes > 0) {
    EXPECT_EQ(cudaMemcpy(s.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return s;
}

// Every byte the weights hold on the device, labelled, in a fixed order.
std::vector<std::pair<std::string, std::string>> Dump(const ModelWeights& w) {
  std::vector<std::pair<std::string, std::string>> out;
  auto linear = [&](const std::string& name, const kernels::LinearHandle& h) {
    if (!h) return;
    const auto* c = dynamic_cast<const kernels::cuda::CudaLinearWeight*>(h.get());
    EXPECT_NE(c, nullptr) << name;
    if (c == nullptr) return;
    const int64_t esize = h->format() == kernels::WeightFormat::kF32 ? 4 : h->format() == kernels::WeightFormat::kBF16 ? 2 : 1;
    out.emplace_back(name + " data", DeviceBytes(c->data(), h->n() * h->k() * esize));
    out.emplace_back(name + " scale", DeviceBytes(c->scale(), h->device_bytes() - h->n() * h->k() * esize));
  };
  auto plain = [&](const std::string& name, const PlainTensor& t) {
    out.emplace_back(name, DeviceBytes(t.buffer.data(), t.buffer.bytes()));
  };
  linear("embed", w.embed);
  linear("head", w.head);
  plain("norm", w.norm);
  plain("hc_head_fn", w.hc_head_fn);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = absl::StrCat("layers.", i, ".");
    for (auto [n, h] : {std::pair{"wq_a", &l.wq_a}, {"wq_b", &l.wq_b}, {"wkv", &l.wkv}, {"wo_a", &l.wo_a},
                        {"wo_b", &l.wo_b}, {"idx_wq_b", &l.idx_wq_b}, {"idx_weights_proj", &l.idx_weights_proj},
                        {"cmp_wkv", &l.compressor.wkv}, {"cmp_wgate", &l.compressor.wgate},
                        {"gate", &l.gate}, {"shared_w1", &l.shared_w1}, {"shared_w3", &l.shared_w3},
                        {"shared_w2", &l.shared_w2}}) {
      linear(p + n, *h);
    }
    for (auto [n, t] : {std::pair{"attn_norm", &l.attn_norm}, {"hc_attn_fn", &l.hc_attn_fn}, {"q_norm", &l.q_norm},
                        {"attn_sink", &l.attn_sink}, {"gate_bias", &l.gate_bias}, {"ape", &l.compressor.ape}}) {
      plain(p + n, *t);
    }
    out.emplace_back(p + "tid2eid", DeviceBytes(l.tid2eid.data(), l.tid2eid.bytes()));
    const auto* e = dynamic_cast<const kernels::cuda::moe::CudaExperts*>(l.experts.get());
    EXPECT_NE(e, nullptr);
    if (e == nullptr) continue;
    out.emplace_back(p + "experts", DeviceBytes(e->weights(), e->held() * e->layout().bytes));
    out.emplace_back(p + "expert tables",
                     DeviceBytes(e->expert_slot(), e->device_bytes() - std::max<int64_t>(e->held(), 1) * e->layout().bytes));
  }
  return out;
}

void ExpectSameDeviceBytes(const std::string& dir, ShardSpec spec) {
  auto backend = kernels::MakeBackend({.name = "cuda"});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto ck = ckpt::Checkpoint::Open(dir);
  ASSERT_TRUE(ck.ok()) << ck.status();
  auto config = LoadConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  std::unique_ptr<ShardLayout> shard;
  if (spec.world > 1) {
    auto layout = PlanShardLayout(*config, spec);
    ASSERT_TRUE(layout.ok()) << layout.status();
    shard = std::make_unique<ShardLayout>(*layout);
  }
  WeightLoadStats ms, ss;
  auto mapped = LoadWeights(**ck, *config, **backend, shard.get(), {}, {.mode = WeightLoadOptions::Mode::kMapped}, &ms);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  // Asked for: kAuto maps checkpoints this small (below WeightLoadOptions::auto_stream_min_bytes).
  auto streamed = LoadWeights(**ck, *config, **backend, shard.get(), {}, {.mode = WeightLoadOptions::Mode::kStreamed},
                              &ss);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_TRUE(ss.streamed);
  EXPECT_EQ(ms.bytes, ss.bytes);
  EXPECT_EQ((*backend)->allocated()[static_cast<int>(kernels::MemoryKind::kHostStaging)], 0) << "staging freed";
  const auto a = Dump(**mapped), b = Dump(**streamed);
  ASSERT_EQ(a.size(), b.size());
  int64_t total = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_TRUE(a[i].second == b[i].second) << a[i].first << " differs on the device";
    total += static_cast<int64_t>(a[i].second.size());
  }
  EXPECT_GT(total, 0);
  std::printf("rank %d of %d: %zu device tensors, %lld bytes identical; %s\n", spec.rank, spec.world, a.size(),
              static_cast<long long>(total), ss.ToString().c_str());
}

std::string TinyJson() {
  std::ifstream in(SourceDir() + "/configs/tiny.json");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(WeightStreamCuda, DeviceBytesEqualMappedLoad) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << why;
  ExpectSameDeviceBytes(TinyCheckpoint(), {});
  ExpectSameDeviceBytes(TinyCheckpoint(), {.rank = 1, .world = 2});
}

TEST(WeightStreamCuda, Mxfp4ShardedCheckpointDeviceBytesEqual) {
  std::string why;
  if (!HaveGpu(&why)) GTEST_SKIP() << why;
  const std::string dir = TinyCheckpoint() + "-mxfp4";
  auto s = gen::GenerateCheckpoint(TinyJson(), {.seed = 2, .out_dir = dir, .shards = 2,
                                                .experts = ExpertFormat::kMxfp4, .overwrite = true});
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectSameDeviceBytes(dir, {});
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dsv4::model::testing
