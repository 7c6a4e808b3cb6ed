// The in-memory synthetic checkpoint: see synthetic_weights.h.
#include "bench/decode/synthetic_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/ops/synth.h"
#include "common/status_macros.h"
#include "tools/make_checkpoint/param_init.h"

namespace dsv4::bench {
namespace {

using ckpt::DType;
using ckpt::WeightFormat;

// Everything the views point into; owned by the Checkpoint (keep_alive).
struct Store {
  std::vector<uint8_t> fp8_codes;                // pool of e4m3 codes
  std::vector<uint8_t> fp4_codes, fp4_scales;    // pools of e2m1 nibbles and of their block scales
  std::map<std::string, std::vector<uint8_t>> owned;  // per distinct (name without layer, shape)
  std::vector<std::unique_ptr<float>> scalars;        // F32 [] scalars
};

constexpr int64_t kFp8Pool = int64_t{96} << 20;
constexpr int64_t kFp4CodePool = int64_t{64} << 20;
constexpr int64_t kFp4ScalePool = int64_t{8} << 20;

void FillRandom(uint64_t seed, uint8_t* p, int64_t n) {
  Rng rng(seed);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t r = rng.Next();
    std::memcpy(p + i, &r, 8);
  }
  const uint64_t r = rng.Next();
  for (int j = 0; i < n; ++i, ++j) p[i] = static_cast<uint8_t>(r >> (8 * j));
}

// Random bf16 values, uniform in (-scale, scale) (offset added), in parallel chunks (the embedding and the head are
// 1 GB each); the output depends only on the seed.
void FillBf16(uint64_t seed, float offset, float scale, uint16_t* out, int64_t n) {
  constexpr int64_t kChunk = int64_t{1} << 22;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const int threads = static_cast<int>(std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, 16));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      for (int64_t c = t; c < chunks; c += threads) {
        Rng rng(seed * 1000003 + static_cast<uint64_t>(c));
        const int64_t end = std::min(n, (c + 1) * kChunk);
        for (int64_t i = c * kChunk; i < end; ++i) {
          const float v = offset + scale * (static_cast<float>(static_cast<double>(rng.Next() >> 40) * 0x1p-23) - 1.f);
          uint32_t bits;
          std::memcpy(&bits, &v, 4);
          out[i] = static_cast<uint16_t>(bits >> 16);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
}

// "layers.12.attn.wq_a" -> "attn.wq_a" (layers share what does not depend on the layer).
std::string WithoutLayer(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return name;
  const size_t dot = name.find('.', 7);
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

std::string ShapeKey(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) absl::StrAppend(&s, "x", d);
  return s;
}

uint64_t Hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Standard deviation tools/make_checkpoint gives the parameter (uniform scale / sqrt 3).
double TargetStd(const ParamSpec& p, int64_t layers) {
  return static_cast<double>(gen::InitFor(p, layers).scale) / std::sqrt(3.0);
}

}  // namespace

absl::StatusOr<SyntheticWeights> MakeSyntheticWeights(const Config& c, ExpertFormat experts,
                                                      const RoutingSpec& routing, uint64_t seed) {
  auto store = std::make_shared<Store>();
  SyntheticWeights out;
  // Pools.
  store->fp8_codes.resize(static_cast<size_t>(kFp8Pool + (int64_t{64} << 20)));
  FillRandom(seed ^ 0xf8, store->fp8_codes.data(), static_cast<int64_t>(store->fp8_codes.size()));
  for (uint8_t& b : store->fp8_codes) {
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN code
  }
  const int64_t matrix_codes = c.moe_intermediate_size * c.hidden_size / 2;
  const bool nv = experts == ExpertFormat::kNvfp4;
  const int64_t matrix_scales = c.moe_intermediate_size * c.hidden_size / (nv ? 16 : 32);
  store->fp4_codes.resize(static_cast<size_t>(kFp4CodePool + matrix_codes));
  store->fp4_scales.resize(static_cast<size_t>(kFp4ScalePool + matrix_scales));
  FillRandom(seed ^ 0xf4, store->fp4_codes.data(), static_cast<int64_t>(store->fp4_codes.size()));
  FillRandom(seed ^ 0xf5, store->fp4_scales.data(), static_cast<int64_t>(store->fp4_scales.size()));
  // NVFP4 scales: positive normal e4m3 in 2^-1 .. 2^1 (exponent field 6..8); MXFP4: set per tensor below via a
  // constant ue8m0 (the pool is then unused).
  for (uint8_t& s : store->fp4_scales) s = static_cast<uint8_t>(((6 + (s >> 3) % 3) << 3) | (s & 7));
  int64_t host = static_cast<int64_t>(store->fp8_codes.size() + store->fp4_codes.size() + store->fp4_scales.size());

  // Routing parameters. Router logits: the gate's std 2/sqrt(D) over an RMS-normed input give logits ~N(0, 4).
  out.hot_bias = CalibrateHotBias(routing, c.n_routed_experts, c.num_experts_per_tok, 2.0);

  std::vector<ckpt::TensorView> views;
  const int64_t L = c.num_hidden_layers;
  uint64_t window = 0;  // advances per tensor: different windows of the pools
  auto owned = [&](const std::string& key, int64_t bytes, const std::function<void(uint8_t*)>& fill) -> const uint8_t* {
    auto it = store->owned.find(key);
    if (it == store->owned.end()) {
      std::vector<uint8_t> v(static_cast<size_t>(bytes));
      fill(v.data());
      host += bytes;
      it = store->owned.emplace(key, std::move(v)).first;
    }
    return it->second.data();
  };
  auto scalar = [&](float v) {
    store->scalars.push_back(std::make_unique<float>(v));
    return reinterpret_cast<const uint8_t*>(store->scalars.back().get());
  };
  for (const ParamSpec& p : ParamInventory(c, experts)) {
    if (p.layer >= L) continue;  // MTP: not read by decode
    const double std_dev = p.kind == ParamKind::kTid2Eid ? 0.0 : TargetStd(p, L);
    const std::string key = WithoutLayer(p.name) + ShapeKey(p.shape);
    const bool expert = p.name.find(".ffn.experts.") != std::string::npos;
    for (const TensorSpec& t : TensorsOf(p)) {
      ckpt::TensorView v{.name = t.name, .dtype = t.dtype, .shape = t.shape, .data = nullptr,
                         .nbytes = static_cast<size_t>(t.nbytes())};
      const int64_t bytes = t.nbytes();
      ++window;
      const uint64_t spread = (window * 0x9e3779b97f4a7c15ull) >> 20;
      if (p.kind == ParamKind::kTid2Eid) {
        v.data = owned(p.name, bytes, [&](uint8_t* d) {  // per layer
          const std::vector<int64_t> ids = Tid2Eid(routing, c.vocab_size, c.n_routed_experts, c.num_experts_per_tok,
                                                   seed ^ 0x71d, p.layer);
          std::memcpy(d, ids.data(), static_cast<size_t>(bytes));
        });
      } else if (p.kind == ParamKind::kRouterBias) {
        v.data = owned(p.name, bytes, [&](uint8_t* d) {  // per layer
          const std::vector<float> b = GateBias(routing, c.n_routed_experts, out.hot_bias, seed ^ 0xb1a5, p.layer);
          std::memcpy(d, b.data(), static_cast<size_t>(bytes));
        });
      } else if (p.kind == ParamKind::kEmbedding) {  // 1 GB at flash: generated in parallel
        const gen::Init init = gen::InitFor(p, L);
        v.data = owned(key, bytes, [&](uint8_t* d) {
          FillBf16(seed ^ Hash(key), init.offset, init.scale, reinterpret_cast<uint16_t*>(d), bytes / 2);
        });
      } else if (!p.linear) {
        v.data = owned(key, bytes, [&](uint8_t* d) {
          const std::vector<uint8_t> b = gen::UnquantizedBytes(p, L, seed ^ Hash(key));
          std::memcpy(d, b.data(), static_cast<size_t>(bytes));
        });
      } else if (p.format == WeightFormat::kBF16 || p.format == WeightFormat::kF32) {
        const gen::Init init = gen::InitFor(p, L);
        // The router of each layer is its own (2 MB): a router shared by every layer would send a token to the same
        // experts in every layer, since the residual stream changes slowly from layer to layer.
        const std::string k = p.kind == ParamKind::kRouter ? p.name : key;
        v.data = owned(k, bytes, [&](uint8_t* d) {
          if (t.dtype == DType::kBF16) {
            FillBf16(seed ^ Hash(k), init.offset, init.scale, reinterpret_cast<uint16_t*>(d), bytes / 2);
          } else {
            const std::vector<uint8_t> b = gen::UnquantizedBytes(p, L, seed ^ Hash(key));
            std::memcpy(d, b.data(), static_cast<size_t>(bytes));
          }
        });
      } else if (p.format == WeightFormat::kFp8Block128) {
        if (t.role == TensorRole::kWeight) {
          v.data = store->fp8_codes.data() + (spread % static_cast<uint64_t>(kFp8Pool)) / 16 * 16;
          if (bytes > int64_t{64} << 20) return absl::InternalError(absl::StrCat(t.name, ": larger than the FP8 pool's slack"));
        } else {
          // Uniform e4m3 codes have rms ~128: a scale of std / 128 gives the target std (nearest power of two).
          const int e = static_cast<int>(std::lround(std::log2(std_dev / 128.0)));
          v.data = owned(absl::StrCat("ue8m0:", e, ":", bytes), bytes,
                         [&](uint8_t* d) { std::memset(d, 127 + e, static_cast<size_t>(bytes)); });
        }
      } else if (expert) {  // NVFP4 / MXFP4 routed experts
        // e2m1 codes uniform over all 16 have rms ~3.3.
        switch (t.role) {
          case TensorRole::kWeight:
            v.data = store->fp4_codes.data() + (spread % static_cast<uint64_t>(kFp4CodePool));
            break;
          case TensorRole::kScale:
          case TensorRole::kWeightScale:
            if (nv) {
              v.data = store->fp4_scales.data() + (spread % static_cast<uint64_t>(kFp4ScalePool));
            } else {
              const int e = static_cast<int>(std::lround(std::log2(std_dev / 3.3)));
              v.data = owned(absl::StrCat("mx-ue8m0:", e, ":", bytes), bytes,
                             [&](uint8_t* d) { std::memset(d, 127 + e, static_cast<size_t>(bytes)); });
            }
            break;
          case TensorRole::kWeightScale2:  // codes (rms 3.3) x scales (~1.1): global = std / 3.6
            v.data = scalar(static_cast<float>(std_dev / 3.6));
            break;
          case TensorRole::kInputScale:
            v.data = scalar(1.f);
            break;
          case TensorRole::kPlain:
            return absl::InternalError(absl::StrCat(t.name, ": a plain tensor inside an expert linear"));
        }
      } else {
        return absl::UnimplementedError(absl::StrCat(t.name, ": no synthetic data for format ",
                                                     ckpt::WeightFormatName(p.format)));
      }
      views.push_back(std::move(v));
    }
  }
  out.tensors = static_cast<int64_t>(views.size());
  out.host_bytes = host;
  DSV4_ASSIGN_OR_RETURN(out.checkpoint, ckpt::Checkpoint::InMemory("(synthetic)", std::move(views), store));
  return out;
}

}  // namespace dsv4::bench
