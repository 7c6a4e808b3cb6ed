// Synthetic but valid inputs for dsv4-ops-bench, generated on the host and handed to a backend the way a loader
// would: linear weights in their checkpoint formats (e4m3 codes without the NaN code, finite ue8m0 / e4m3
// scales, finite bf16), routed experts as NVFP4 / MXFP4 views over shared random byte pools, 584-byte FP8 KV
// rows encoded by kernels/sparse_mla's encoder, and helpers that fill large backend buffers by tiling one host
// image (generating gigabytes on the host would dominate the run). No checkpoint on disk is involved.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "kernels/weights.h"

namespace dsv4::bench {

// SplitMix64: fast, seedable, identical everywhere (no std:: distribution whose output varies by library).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next();
  float Uniform(float lo, float hi);  // [lo, hi)
  float Normal();                     // N(0, 1), Box-Muller
  int64_t Int(int64_t n);             // [0, n)

 private:
  uint64_t s_;
};

// A linear weight in its checkpoint format over host bytes it owns (view points into data / scale).
struct HostLinear {
  kernels::WeightView view;
  std::vector<uint8_t> data, scale;
};
// F32 / BF16 / FP8 block-128 (ue8m0 scales) weight [n, k] with |W| ~ 1 / sqrt(k). Every byte is a finite value
// of its format.
HostLinear SynthLinear(const std::string& name, kernels::WeightFormat format, int64_t n, int64_t k, uint64_t seed);

// One MoE layer's routed experts as checkpoint views: E experts of w1 / w3 [I, D] and w2 [D, I] in NVFP4 or
// MXFP4, the experts [held_first, held_first + held) with data, the others empty (another rank's). The views
// point at offsets of two shared random pools (codes: every nibble is an e2m1 code; scales: positive finite
// e4m3 around 1, or ue8m0 in [120, 123]), so 256 experts cost tens of MB of host memory, not 3.6 GB.
struct HostExperts {
  std::vector<uint8_t> codes, scales;
  std::vector<kernels::WeightView> w1, w3, w2;
};
HostExperts SynthExperts(kernels::WeightFormat format, int64_t experts, int64_t dim, int64_t inter,
                         int64_t held_first, int64_t held, uint64_t seed);

// `rows` x `dim` floats ~ N(0, stddev).
std::vector<float> RandomFloats(int64_t n, uint64_t seed, float stddev = 1.f);

// A host image of `pages` FP8 KV pages (kFp8Row584, 512 dims, page_rows rows): every row a real encode of a
// random key (kernels/sparse_mla EncodeKvRow), scales in the page footers.
std::vector<uint8_t> Fp8PageImage(int pages, int page_rows, uint64_t seed);

// Fills `bytes` of backend memory at dst with copies of `image` (the last one cut short), then synchronises.
absl::Status FillTiled(kernels::Backend& backend, void* dst, int64_t bytes, const std::vector<uint8_t>& image);
// Same with a float image.
absl::Status FillTiledF32(kernels::Backend& backend, float* dst, int64_t n, const std::vector<float>& image);

// Backend memory holding `host` (synchronised), as the given kind.
template <typename T>
absl::StatusOr<kernels::Buffer> UploadVector(kernels::Backend& backend, const std::vector<T>& host,
                                             kernels::MemoryKind kind = kernels::MemoryKind::kWorkspace) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(T));
  absl::StatusOr<kernels::Buffer> buf = backend.Allocate(bytes, kind);
  if (!buf.ok() || bytes == 0) return buf;
  if (absl::Status s = backend.CopyToDevice(buf->data(), host.data(), bytes); !s.ok()) return s;
  if (absl::Status s = backend.Synchronize(); !s.ok()) return s;
  return buf;
}

// Host copy of n elements of backend memory.
template <typename T>
absl::StatusOr<std::vector<T>> DownloadVector(kernels::Backend& backend, const void* src, int64_t n) {
  std::vector<T> host(static_cast<size_t>(n));
  if (n > 0) {
    if (absl::Status s = backend.CopyToHost(host.data(), src, n * static_cast<int64_t>(sizeof(T))); !s.ok()) return s;
  }
  return host;
}

}  // namespace dsv4::bench
