// Shared helpers of the CUDA op tests (test_util.h).
#include "tests/cuda/test_util.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "common/float_formats.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/gpu_check/gpu_check.h"

namespace dsv4::kernels::cuda::testing {

bool HaveGpu(std::string* why) { return ::dsv4::testing::HaveGpu(why); }

Backends GetBackends() {
  // Made once and kept for the whole binary (a fresh CUDA backend per test would re-create its stream).
  static std::unique_ptr<Backend> cpu = cpu::MakeCpuBackend(8);
  static std::unique_ptr<Backend> gpu = [] {
    absl::StatusOr<std::unique_ptr<Backend>> b = MakeCudaBackend(0);
    if (!b.ok()) {
      ADD_FAILURE() << "MakeCudaBackend(0): " << b.status();
      return std::unique_ptr<Backend>();
    }
    return *std::move(b);
  }();
  if (gpu == nullptr) std::abort();  // the failure above says why
  return Backends{.cpu = *cpu, .cuda = *gpu};
}

Buffer UploadBytes(Backend& b, const void* host, int64_t bytes) {
  absl::StatusOr<Buffer> buf = b.Allocate(bytes, MemoryKind::kWorkspace);
  EXPECT_TRUE(buf.ok()) << buf.status();
  if (!buf.ok()) return Buffer();
  if (bytes > 0) {
    const absl::Status s = b.CopyToDevice(buf->data(), host, bytes);
    EXPECT_TRUE(s.ok()) << s;
    const absl::Status sync = b.Synchronize();
    EXPECT_TRUE(sync.ok()) << sync;
  }
  return *std::move(buf);
}

Buffer Upload(Backend& b, std::span<const float> host, MemoryKind kind) {
  absl::StatusOr<Buffer> buf = b.UploadF32(host, kind);
  EXPECT_TRUE(buf.ok()) << buf.status();
  return buf.ok() ? *std::move(buf) : Buffer();
}

Buffer UploadI32(Backend& b, std::span<const int32_t> host) {
  absl::StatusOr<Buffer> buf = b.UploadI32(host, MemoryKind::kWorkspace);
  EXPECT_TRUE(buf.ok()) << buf.status();
  return buf.ok() ? *std::move(buf) : Buffer();
}

std::vector<float> Download(Backend& b, const Buffer& buf, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  if (n == 0) return out;
  const absl::Status s = b.CopyToHost(out.data(), buf.data(), n * 4);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

Buffer Poisoned(Backend& b, int64_t n) {
  const std::vector<float> nan(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
  return Upload(b, nan);
}

std::vector<float> RandomNormal(std::mt19937& rng, int64_t n, float stddev) {
  std::normal_distribution<float> dist(0.f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

void RoundToBf16(std::vector<float>& v) {
  for (float& x : v) x = Bf16ToF32(F32ToBf16(x));
}

HostWeight RandomWeight(std::mt19937& rng, WeightFormat format, int64_t n, int64_t k, bool scale_f32) {
  HostWeight w;
  const float stddev = 1.f / std::sqrt(static_cast<float>(k));
  std::normal_distribution<float> dist(0.f, stddev);
  w.view = WeightView{.name = "test.weight", .format = format, .n = n, .k = k};
  switch (format) {
    case WeightFormat::kF32: {
      w.data.resize(static_cast<size_t>(n * k * 4));
      for (int64_t i = 0; i < n * k; ++i) {
        const float v = dist(rng);
        std::memcpy(&w.data[i * 4], &v, 4);
      }
      break;
    }
    case WeightFormat::kBF16: {
      w.data.resize(static_cast<size_t>(n * k * 2));
      for (int64_t i = 0; i < n * k; ++i) {
        const uint16_t h = F32ToBf16(dist(rng));
        std::memcpy(&w.data[i * 2], &h, 2);
      }
      break;
    }
    case WeightFormat::kFp8Block128: {
      // e4m3 codes over the whole range (subnormals and zeros included, never NaN), block scales near the
      // 1/(448 sqrt(k)) a quantiser picks, so W's magnitudes look trained.
      w.data.resize(static_cast<size_t>(n * k));
      // One code in ten uniform over all 254 finite codes, so zeros and subnormals are well represented.
      std::normal_distribution<float> code_dist(0.f, 120.f);
      std::uniform_int_distribution<int> any_code(0, 253), pick(0, 9);
      for (uint8_t& b : w.data) {
        if (pick(rng) == 0) {
          const int c = any_code(rng);  // skip 0x7f and 0xff (NaN)
          b = static_cast<uint8_t>(c < 0x7f ? c : c + 1);
        } else {
          b = F32ToE4m3(code_dist(rng));
        }
      }
      const int64_t blocks = ((n + 127) / 128) * ((k + 127) / 128);
      const float base = stddev / 120.f;
      std::uniform_int_distribution<int> exp_jitter(-2, 2);
      std::uniform_real_distribution<float> mant(1.f, 2.f);
      w.view.scale_f32 = scale_f32;
      w.scale.resize(static_cast<size_t>(blocks * (scale_f32 ? 4 : 1)));
      for (int64_t i = 0; i < blocks; ++i) {
        const float pow2 = std::ldexp(1.f, static_cast<int>(std::floor(std::log2(base))) + exp_jitter(rng));
        if (scale_f32) {
          const float s = pow2 * mant(rng);  // not a power of two
          std::memcpy(&w.scale[i * 4], &s, 4);
        } else {
          w.scale[i] = Ue8m0CeilFromF32(pow2);
        }
      }
      break;
    }
    case WeightFormat::kNvfp4:
    case WeightFormat::kMxfp4: {
      // Only shapes matter here (PrepareLinear refuses these formats on CUDA).
      w.data.assign(static_cast<size_t>(n * k / 2), 0x22);
      const int64_t block = format == WeightFormat::kNvfp4 ? 16 : 32;
      w.scale.assign(static_cast<size_t>(n * k / block), format == WeightFormat::kNvfp4 ? 0x38 : 127);
      break;
    }
  }
  w.view.data = w.data.data();
  w.view.scale = w.scale.empty() ? nullptr : w.scale.data();
  return w;
}

Diff Compare(std::span<const float> got, std::span<const float> want) {
  Diff d;
  double num = 0, den = 0;
  int64_t first_bad = -1;
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      if (first_bad < 0) first_bad = static_cast<int64_t>(i);
      continue;
    }
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    num += e * e;
    den += static_cast<double>(want[i]) * want[i];
    if (e > d.max_abs || d.worst < 0) {
      d.max_abs = e;
      d.worst = static_cast<int64_t>(i);
    }
  }
  d.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  d.non_finite = first_bad >= 0 || got.size() != want.size();  // a size mismatch never passes either
  if (first_bad >= 0) d.worst = first_bad;
  return d;
}

void ExpectClose(const std::string& what, std::span<const float> got, std::span<const float> want, double max_rel,
                 double max_abs_err) {
  const Diff d = Compare(got, want);
  const size_t w = d.worst < 0 ? 0 : static_cast<size_t>(d.worst);
  const double g = w < got.size() ? got[w] : NAN, e = w < want.size() ? want[w] : NAN;
  std::printf("  %-58s max_abs %.3e  rel %.3e  worst [%lld] got %.6g want %.6g%s\n", what.c_str(), d.max_abs, d.rel,
              static_cast<long long>(d.worst), g, e, d.non_finite ? "  NON-FINITE" : "");
  EXPECT_FALSE(d.non_finite) << what << ": NaN/inf at index " << d.worst << " (got " << g << ", want " << e
                             << ") or size " << got.size() << " vs " << want.size();
  EXPECT_LE(d.rel, max_rel) << what << ": relative error by norm";
  EXPECT_LE(d.max_abs, max_abs_err) << what << ": max abs error at index " << d.worst;
}

void ExpectBitEqual(const std::string& what, std::span<const float> got, std::span<const float> want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (F32Bits(got[i]) != F32Bits(want[i])) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++mismatches;
    }
  }
  std::printf("  %-58s %lld of %zu values differ in bits\n", what.c_str(), static_cast<long long>(mismatches),
              got.size());
  if (mismatches > 0) {
    ADD_FAILURE() << what << ": " << mismatches << " values differ, first at [" << first << "] got " << got[first]
                  << " want " << want[first];
  }
}

}  // namespace dsv4::kernels::cuda::testing
