// Synthetic weights, experts and KV rows for dsv4-ops-bench: see synth.h.
#include "bench/ops/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "common/float_formats.h"
#include "common/status_macros.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::bench {

using kernels::WeightFormat;

uint64_t Rng::Next() {
  uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float Rng::Uniform(float lo, float hi) {
  return lo + (hi - lo) * static_cast<float>(static_cast<double>(Next() >> 40) * 0x1p-24);
}

float Rng::Normal() {
  const double u1 = (static_cast<double>(Next() >> 11) + 1.0) * 0x1p-53;  // (0, 1]
  const double u2 = static_cast<double>(Next() >> 11) * 0x1p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

int64_t Rng::Int(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }

namespace {

// Random bytes, 8 at a time.
void FillRandomBytes(Rng& rng, std::vector<uint8_t>& v) {
  size_t i = 0;
  for (; i + 8 <= v.size(); i += 8) {
    const uint64_t r = rng.Next();
    std::memcpy(v.data() + i, &r, 8);
  }
  const uint64_t r = rng.Next();
  for (int j = 0; i < v.size(); ++i, ++j) v[i] = static_cast<uint8_t>(r >> (8 * j));
}

}  // namespace

HostLinear SynthLinear(const std::string& name, WeightFormat format, int64_t n, int64_t k, uint64_t seed) {
  Rng rng(seed);
  HostLinear w;
  w.view = kernels::WeightView{.name = name, .format = format, .n = n, .k = k};
  // log2 of the target magnitude 1/sqrt(k).
  const int e_target = static_cast<int>(std::lround(-0.5 * std::log2(static_cast<double>(k))));
  switch (format) {
    case WeightFormat::kF32: {
      w.data.resize(static_cast<size_t>(n * k * 4));
      const float stddev = 1.f / std::sqrt(static_cast<float>(k));
      for (int64_t i = 0; i < n * k; ++i) {
        const float v = rng.Normal() * stddev;
        std::memcpy(&w.data[static_cast<size_t>(i) * 4], &v, 4);
      }
      break;
    }
    case WeightFormat::kBF16: {
      // Sign, exponent e_target - 2 .. e_target + 1, random 7-bit mantissa: finite, never subnormal.
      w.data.resize(static_cast<size_t>(n * k * 2));
      uint16_t* out = reinterpret_cast<uint16_t*>(w.data.data());
      const int64_t count = n * k;
      for (int64_t i = 0; i < count; i += 4) {
        const uint64_t r = rng.Next();
        for (int j = 0; j < 4 && i + j < count; ++j) {
          const uint32_t bits = static_cast<uint32_t>(r >> (16 * j)) & 0xffffu;
          const uint32_t sign = bits >> 15, exp = static_cast<uint32_t>(127 + e_target - 2 + ((bits >> 7) & 3));
          uint16_t h = static_cast<uint16_t>((sign << 15) | (exp << 7) | (bits & 0x7f));
          std::memcpy(&out[i + j], &h, 2);
        }
      }
      break;
    }
    case WeightFormat::kFp8Block128: {
      // Uniform e4m3 codes (every finite code, NaN 0x7f / 0xff moved to 0x7e / 0xfe): their rms is ~128, so a
      // block scale of 2^(e_target - 7) gives |W| ~ 1/sqrt(k); +-1 binade of jitter per block.
      w.data.resize(static_cast<size_t>(n * k));
      FillRandomBytes(rng, w.data);
      for (uint8_t& b : w.data) {
        if ((b & 0x7f) == 0x7f) b ^= 1;
      }
      const int64_t blocks = ((n + 127) / 128) * ((k + 127) / 128);
      w.scale.resize(static_cast<size_t>(blocks));
      for (uint8_t& s : w.scale) s = static_cast<uint8_t>(127 + e_target - 7 - 1 + rng.Int(3));
      break;
    }
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4:
      break;  // routed experts only: SynthExperts
  }
  w.view.data = w.data.data();
  w.view.scale = w.scale.empty() ? nullptr : w.scale.data();
  return w;
}

HostExperts SynthExperts(WeightFormat format, int64_t experts, int64_t dim, int64_t inter, int64_t held_first,
                         int64_t held, uint64_t seed) {
  Rng rng(seed);
  HostExperts h;
  const bool nv = format == WeightFormat::kNvfp4;
  const int64_t block = nv ? 16 : 32;
  const int64_t code_bytes = inter * dim / 2, scale_bytes = inter * dim / block;  // one matrix (all three same size)
  // Pools larger than one matrix by enough that experts see different windows of them.
  constexpr int64_t kCodePool = int64_t{64} << 20, kScalePool = int64_t{8} << 20;
  h.codes.resize(static_cast<size_t>(kCodePool + code_bytes));
  h.scales.resize(static_cast<size_t>(kScalePool + scale_bytes));
  FillRandomBytes(rng, h.codes);  // every nibble is an e2m1 code
  FillRandomBytes(rng, h.scales);
  for (uint8_t& s : h.scales) {
    const uint32_t v = s;
    // NVFP4: positive normal e4m3 2^-2 .. 2^2 (exponent field 5..9, any mantissa); MXFP4: ue8m0 118..121.
    s = nv ? static_cast<uint8_t>(((5 + v % 5) << 3) | ((v >> 3) & 7)) : static_cast<uint8_t>(118 + (v & 3));
  }
  const float global = 0.25f / std::sqrt(static_cast<float>(dim));
  for (std::vector<kernels::WeightView>* m : {&h.w1, &h.w3, &h.w2}) m->resize(static_cast<size_t>(experts));
  for (int64_t e = 0; e < experts; ++e) {
    const bool holds = e >= held_first && e < held_first + held;
    for (int m = 0; m < 3; ++m) {
      kernels::WeightView& v = (m == 0 ? h.w1 : m == 1 ? h.w3 : h.w2)[static_cast<size_t>(e)];
      v.name = "ffn.experts." + std::to_string(e) + (m == 0 ? ".w1" : m == 1 ? ".w3" : ".w2");
      v.format = format;
      v.n = m < 2 ? inter : dim;
      v.k = m < 2 ? dim : inter;
      v.global_scale = nv ? global : 1.f;
      if (!holds) continue;
      const int64_t slot = e * 3 + m;
      v.data = h.codes.data() + (slot * 7919 * 4096) % kCodePool;
      v.scale = h.scales.data() + (slot * 7919 * 512) % kScalePool;
    }
  }
  return h;
}

std::vector<float> RandomFloats(int64_t n, uint64_t seed, float stddev) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = rng.Normal() * stddev;
  return v;
}

std::vector<uint8_t> Fp8PageImage(int pages, int page_rows, uint64_t seed) {
  namespace sm = kernels::sparse_mla;
  std::vector<uint8_t> image(static_cast<size_t>(pages * sm::KvPageStrideBytes(page_rows)), 0);
  Rng rng(seed);
  std::vector<float> key(sm::kKvDim);
  for (int64_t row = 0; row < int64_t{pages} * page_rows; ++row) {
    for (float& x : key) x = rng.Normal();
    sm::EncodeKvRow(std::span<const float, sm::kKvDim>(key.data(), sm::kKvDim),
                    image.data() + sm::KvRowDataOffset(row, page_rows), image.data() + sm::KvRowScaleOffset(row, page_rows));
  }
  return image;
}

absl::Status FillTiled(kernels::Backend& backend, void* dst, int64_t bytes, const std::vector<uint8_t>& image) {
  const int64_t chunk = static_cast<int64_t>(image.size());
  if (chunk == 0) return absl::InvalidArgumentError("FillTiled: empty image");
  uint8_t* out = static_cast<uint8_t*>(dst);
  for (int64_t at = 0; at < bytes; at += chunk) {
    DSV4_RETURN_IF_ERROR(backend.CopyToDevice(out + at, image.data(), std::min(chunk, bytes - at)));
  }
  return backend.Synchronize();
}

absl::Status FillTiledF32(kernels::Backend& backend, float* dst, int64_t n, const std::vector<float>& image) {
  const int64_t chunk = static_cast<int64_t>(image.size());
  if (chunk == 0) return absl::InvalidArgumentError("FillTiledF32: empty image");
  for (int64_t at = 0; at < n; at += chunk) {
    DSV4_RETURN_IF_ERROR(backend.CopyToDevice(dst + at, image.data(), std::min(chunk, n - at) * 4));
  }
  return backend.Synchronize();
}

}  // namespace dsv4::bench
