// KV pools for dsv4-decode-bench: see cache_fill.h.
#include "bench/decode/cache_fill.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "bench/ops/synth.h"
#include "common/status_macros.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::bench {
namespace {

// dst[0, bytes) <- copies of image: the image once, then doubling copies inside backend memory (device to device
// on CUDA), so a 20 GB pool costs one small upload and ~15 large copies.
absl::Status FillDoubling(kernels::Backend& backend, uint8_t* dst, int64_t bytes, const uint8_t* image,
                          int64_t image_bytes) {
  if (bytes <= 0) return absl::OkStatus();
  int64_t filled = std::min(bytes, image_bytes);
  DSV4_RETURN_IF_ERROR(backend.CopyToDevice(dst, image, filled));
  while (filled < bytes) {
    const int64_t n = std::min(filled, bytes - filled);
    DSV4_RETURN_IF_ERROR(backend.CopyToDevice(dst + filled, dst, n));
    filled += n;
  }
  return backend.Synchronize();
}

// What the production model stores in the fp32 indexer pool: the compressor's rows after the Hadamard + FP4
// simulation, i.e. e2m1 values times a power-of-two scale. They are exactly bf16, which the indexer's tensor-core
// scoring relies on; arbitrary floats would send every tile down its fp32 fallback for exact mode (the first
// runs after the tensor-core indexer landed measured that path: 0.45 ms a layer at B = 64, 8K, instead of ~0.04).
std::vector<float> Fp4GridFloats(int64_t n, uint64_t seed) {
  static constexpr float kE2m1[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  std::vector<float> out(static_cast<size_t>(n));
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& v : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
    const float mag = kE2m1[x & 7] * std::ldexp(1.f, -static_cast<int>((x >> 3) & 3));  // scale 2^0 .. 2^-3
    v = (x >> 5) & 1 ? -mag : mag;
  }
  return out;
}

}  // namespace

CachePlan PlanCache(const Config& c, int max_batch, int64_t max_positions, int page_rows) {
  CachePlan p{.page_rows = page_rows, .max_batch = max_batch, .max_positions = max_positions};
  for (int q = 0; q < model::kNumKvPools; ++q) {
    const int64_t rows = model::Dsv4Model::RowsNeeded(c, static_cast<model::KvPool>(q), max_positions);
    p.pages_per_seq[q] = (rows + page_rows - 1) / page_rows;
    p.pool_pages[q] = p.pages_per_seq[q] * max_batch;
  }
  return p;
}

absl::Status FillCache(model::Dsv4Model& m, kernels::Backend& backend, int page_rows, uint64_t seed) {
  namespace sm = kernels::sparse_mla;
  const model::Dsv4Model::CacheMemory mem = m.CacheMemoryForBench();
  const int64_t page_bytes = kernels::KvPageBytes(kernels::KvFormat::kFp8Row584, 512, page_rows);
  if (page_bytes != sm::KvPageStrideBytes(page_rows)) {
    return absl::InternalError(absl::StrCat("KV page of ", page_rows, " rows: the pool's ", page_bytes,
                                            " bytes differ from the encoder's ", sm::KvPageStrideBytes(page_rows)));
  }
  constexpr int kImagePages = 16;
  const std::vector<uint8_t> fp8 = Fp8PageImage(kImagePages, page_rows, seed);
  const std::vector<float> f32 = Fp4GridFloats(int64_t{1} << 18, seed ^ 0x1d);  // the indexer pool (fp32 rows)
  for (int q = 0; q < model::kNumKvPools; ++q) {
    if (mem.pool[q] == nullptr) continue;
    auto* dst = static_cast<uint8_t*>(mem.pool[q]);
    if (mem.fp8_rows[q]) {
      if (mem.pool_bytes[q] % page_bytes != 0) {
        return absl::InternalError(absl::StrCat("pool ", model::kKvPoolNames[q], ": ", mem.pool_bytes[q],
                                                " bytes is not whole pages of ", page_bytes));
      }
      DSV4_RETURN_IF_ERROR(FillDoubling(backend, dst, mem.pool_bytes[q], fp8.data(), static_cast<int64_t>(fp8.size())));
    } else {
      DSV4_RETURN_IF_ERROR(FillDoubling(backend, dst, mem.pool_bytes[q] / 4 * 4,
                                        reinterpret_cast<const uint8_t*>(f32.data()),
                                        static_cast<int64_t>(f32.size() * 4)));
    }
  }
  if (mem.state != nullptr) {
    const std::vector<float> state = RandomFloats(int64_t{1} << 16, seed ^ 0x57a7e, 0.5f);
    DSV4_RETURN_IF_ERROR(FillDoubling(backend, reinterpret_cast<uint8_t*>(mem.state), mem.state_floats * 4,
                                      reinterpret_cast<const uint8_t*>(state.data()),
                                      static_cast<int64_t>(state.size() * 4)));
  }
  return absl::OkStatus();
}

std::vector<model::SeqBlockTables> MakeTables(const Config& c, const CachePlan& plan, int batch, int64_t positions) {
  std::vector<model::SeqBlockTables> tables(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    tables[b].state_slot = b;
    for (int q = 0; q < model::kNumKvPools; ++q) {
      const int64_t rows = model::Dsv4Model::RowsNeeded(c, static_cast<model::KvPool>(q), positions);
      const int64_t need = (rows + plan.page_rows - 1) / plan.page_rows;
      for (int64_t k = 0; k < need; ++k) tables[b].pages[q].push_back(static_cast<int32_t>(b * plan.pages_per_seq[q] + k));
    }
  }
  return tables;
}

}  // namespace dsv4::bench
