// Helpers for the CPU backend tests: random data, error measures, fp32 weights through PrepareLinear, host-side
// step indexes, block tables and KV pools laid out as the model lays them out.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

namespace dsv4::kernels::cpu::testing {

inline std::vector<float> Rand(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The CPU backend's documented reduction (cpu_gemm.h), written out again so tests pin it: lane l sums the
// products i = l mod 8 below the last multiple of 8, lane 0 then takes the tail in order, and the lanes
// combine as ((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7)).
inline float RefDot(const float* a, const float* b, int64_t n) {
  float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t body = n / 8 * 8;
  for (int64_t i = 0; i < body; ++i) l[i % 8] += a[i] * b[i];
  for (int64_t i = body; i < n; ++i) l[0] += a[i] * b[i];
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// max |a - b| / max |b|; NaN counts as infinite. Prints the worst index when over `bound`.
inline ::testing::AssertionResult Near(const std::vector<float>& a, const std::vector<double>& b, double bound) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  double diff = 0, mx = 0;
  size_t worst = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = std::isnan(a[i]) ? INFINITY : std::fabs(a[i] - b[i]);
    if (d > diff) diff = d, worst = i;
    mx = std::max(mx, std::fabs(b[i]));
  }
  const double rel = mx > 0 ? diff / mx : diff;
  if (rel <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs err " << diff << ", rel err " << rel << " > " << bound
                                       << " at index " << worst << " (got " << a[worst] << ", want " << b[worst]
                                       << ")";
}

// Bitwise equality of two float arrays, naming the first difference.
inline ::testing::AssertionResult SameBits(const float* a, const float* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, 4) != 0) {
      return ::testing::AssertionFailure() << "first difference at " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}
inline ::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  return SameBits(a.data(), b.data(), a.size());
}

// An fp32 [n, k] weight prepared by the backend.
inline LinearHandle F32Weight(Backend& be, const std::vector<float>& w, int64_t n, int64_t k,
                              const std::string& name = "w") {
  auto h = be.PrepareLinear({.name = name, .format = WeightFormat::kF32, .n = n, .k = k,
                             .data = reinterpret_cast<const uint8_t*>(w.data())});
  EXPECT_TRUE(h.ok()) << h.status();
  return std::move(h).value();
}

// A step's token -> sequence map on the host (the CPU backend's memory is host memory).
struct HostStep {
  std::vector<int32_t> pos, seq, seq_first, seq_len, state_slot;
  int max_seq_len = 1;

  // Sequence b = the next index: `len` tokens at positions start, start + 1, ... with state slot `slot`.
  void AddSeq(int32_t start, int len, int32_t slot) {
    const int32_t b = static_cast<int32_t>(seq_first.size());
    seq_first.push_back(static_cast<int32_t>(pos.size()));
    seq_len.push_back(len);
    state_slot.push_back(slot);
    for (int i = 0; i < len; ++i) {
      pos.push_back(start + i);
      seq.push_back(b);
    }
    max_seq_len = std::max(max_seq_len, len);
  }
  // A padding token (pos -1) of a padding sequence (seq_len 0).
  void AddPadding() {
    const int32_t b = static_cast<int32_t>(seq_first.size());
    seq_first.push_back(static_cast<int32_t>(pos.size()));
    seq_len.push_back(0);
    state_slot.push_back(0);
    pos.push_back(-1);
    seq.push_back(b);
  }
  int64_t t() const { return static_cast<int64_t>(pos.size()); }
  StepIndex view() const {
    return {.pos = pos.data(), .seq = seq.data(), .seq_first = seq_first.data(), .seq_len = seq_len.data(),
            .state_slot = state_slot.data(), .t = t(), .b = static_cast<int64_t>(seq_first.size()),
            .max_seq_len = max_seq_len};
  }
};

// Block tables: row b lists sequence b's physical pages.
struct HostTables {
  std::vector<int32_t> pages;
  int64_t stride = 0;
  HostTables(int64_t seqs, int64_t stride_pages) : pages(seqs * stride_pages, -1), stride(stride_pages) {}
  int32_t& at(int64_t b, int64_t i) { return pages[b * stride + i]; }
  BlockTables view() const { return {.pages = pages.data(), .stride = stride}; }
};

// A KV pool of `pages` pages of P rows (+ staging pages), zeroed.
struct HostPool {
  std::vector<uint8_t> bytes;
  KvCacheView view;
  HostPool(KvFormat format, int dim, int page_rows, int64_t pages) {
    const int64_t pb = KvPageBytes(format, dim, page_rows);
    bytes.assign(pages * pb, 0);
    view = {.base = bytes.data(), .format = format, .dim = dim, .page_rows = page_rows, .page_bytes = pb};
  }
};

}  // namespace dsv4::kernels::cpu::testing
