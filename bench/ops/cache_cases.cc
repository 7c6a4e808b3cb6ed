// The cache family of dsv4-ops-bench: KvWindowWrite (this step's keys into their staging rows and ring rows of the
// 584-byte FP8 window pool) and the three compressors of a layer (main ratio 4 and ratio 128 into FP8 pools, the
// indexer's ratio 4 with Hadamard + FP4 into its f32 pool) for a decode step of T sequences at each T of
// --dense_tokens. Every token closes a window (position R * 64 - 1), so every compressor emits a row: the worst
// case of a decode step. The compressor state (f32 kv and score rows per sequence, up to 512 KB at ratio 128) is
// rotated: input sets are other sequences' state slots.
// Bytes moved per call: KvWindowWrite = keys read + 2 rows of 584 B written per token; a compressor = the state
// read, the token's state rows written, kv and gate read, the emitted row written.
#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/ops/bench.h"
#include "bench/ops/synth.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::bench {
namespace {

namespace sm = kernels::sparse_mla;

// The step index of T decode tokens, one per sequence, all at `pos`; state slots [slot0, slot0 + T) per set.
struct DecodeStep {
  kernels::Buffer pos, seq, len, slots;
  absl::Status Make(kernels::Backend& be, int64_t t, int32_t position, int sets) {
    std::vector<int32_t> p(static_cast<size_t>(t), position), s(static_cast<size_t>(t)), l(static_cast<size_t>(t), 1);
    std::vector<int32_t> sl(static_cast<size_t>(sets * t));
    for (int64_t i = 0; i < t; ++i) s[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    for (int64_t i = 0; i < sets * t; ++i) sl[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    for (auto [dst, src] : {std::pair{&pos, &p}, std::pair{&seq, &s}, std::pair{&len, &l}, std::pair{&slots, &sl}}) {
      absl::StatusOr<kernels::Buffer> b = UploadVector(be, *src);
      if (!b.ok()) return b.status();
      *dst = *std::move(b);
    }
    return absl::OkStatus();
  }
  kernels::StepIndex Index(int64_t t, int set) const {
    return {.pos = pos.as<const int32_t>(), .seq = seq.as<const int32_t>(), .seq_first = seq.as<const int32_t>(),
            .seq_len = len.as<const int32_t>(), .state_slot = slots.as<const int32_t>() + set * t, .t = t, .b = t,
            .max_seq_len = 1};
  }
};

// OK when every row of the FP8 pool rows [first, first + n) decodes to finite values.
absl::Status CheckFp8Rows(kernels::Backend& be, const uint8_t* pool, int page_rows, int64_t first, int64_t n,
                          int64_t step_rows) {
  const int64_t page_bytes = sm::KvPageStrideBytes(page_rows);
  std::vector<float> key(sm::kKvDim);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = first + i * step_rows, page = row / page_rows;
    absl::StatusOr<std::vector<uint8_t>> bytes = DownloadVector<uint8_t>(be, pool + page * page_bytes, page_bytes);
    if (!bytes.ok()) return bytes.status();
    const int64_t r = row % page_rows;
    sm::DecodeKvRow(bytes->data() + r * sm::kRowDataBytes,
                    bytes->data() + int64_t{page_rows} * sm::kRowDataBytes + r * sm::kRowScaleBytes,
                    std::span<float, sm::kKvDim>(key.data(), sm::kKvDim));
    for (float v : key) {
      if (!std::isfinite(v)) return absl::DataLossError(absl::StrCat("pool row ", row, " decodes to ", v));
    }
  }
  return absl::OkStatus();
}

void RunKvWrite(Bench& b, int64_t t, uint64_t seed) {
  kernels::Backend& be = b.backend;
  const Shapes& s = b.shapes;
  const int P = s.page_rows;
  const int64_t wpps = (s.window + P - 1) / P, ring_pages = t * wpps, pages = ring_pages + (t + P - 1) / P;
  const std::string shape = absl::StrFormat("FP8 rows, W=%d, T=%d", s.window, t);
  DecodeStep step;
  absl::Status st = step.Make(be, t, 4095, 1);
  absl::StatusOr<kernels::Buffer> pool = be.Allocate(pages * sm::KvPageStrideBytes(P), kernels::MemoryKind::kKvCache);
  std::vector<int32_t> table(static_cast<size_t>(ring_pages));
  for (int64_t i = 0; i < ring_pages; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  absl::StatusOr<kernels::Buffer> tab = UploadVector(be, table);
  absl::StatusOr<kernels::Buffer> keys = UploadVector(be, RandomFloats(t * sm::kKvDim, seed));
  for (const absl::Status& e : {st, pool.status(), tab.status(), keys.status()}) {
    if (!e.ok()) return b.Fail("cache", "kv_window_write", shape, e);
  }
  const kernels::KvWindowWriteArgs args{
      .rows = keys->as<const float>(),
      .cache = {.base = pool->as<uint8_t>(), .format = kernels::KvFormat::kFp8Row584, .dim = sm::kKvDim,
                .page_rows = P, .page_bytes = sm::KvPageStrideBytes(P)},
      .step = step.Index(t, 0),
      .tables = {.pages = tab->as<const int32_t>(), .stride = wpps},
      .staging_row0 = static_cast<int32_t>(ring_pages * P),
      .window = static_cast<int>(s.window),
      .commit = false};
  Case c{.family = "cache", .op = "kv_window_write", .shape = shape, .params = {{"t", t}, {"window", s.window}}};
  c.enqueue = [&be, args](int) { be.ops().KvWindowWrite(args); };
  c.bytes = [t](int) { return t * (4.0 * sm::kKvDim + 2.0 * sm::kRowBytes); };
  const uint8_t* base = pool->as<const uint8_t>();
  c.check = [&be, base, P, ring_pages, t] { return CheckFp8Rows(be, base, P, ring_pages * P, t, 1); };
  b.Run(be, c);
}

struct CompressorSpec {
  const char* op;
  int ratio, d;
  bool fp8, hadamard;
};

void RunCompressor(Bench& b, const CompressorSpec& spec, int64_t t, uint64_t seed) {
  kernels::Backend& be = b.backend;
  const Shapes& s = b.shapes;
  const int P = s.page_rows, C = spec.ratio == 4 ? 2 : 1, R = spec.ratio, d = spec.d;
  const int64_t cd = int64_t{C} * d, stride = int64_t{C} * R * cd;  // floats per slot
  const double state_bytes = 8.0 * stride;                          // kv and score rows of one slot
  const int sets = b.SetsFor(state_bytes * t);
  const kernels::KvFormat format = spec.fp8 ? kernels::KvFormat::kFp8Row584 : kernels::KvFormat::kF32;
  const int64_t page_bytes = kernels::KvPageBytes(format, d, P);
  const std::string shape = absl::StrFormat("R=%d d=%d %s%s, T=%d", R, d, spec.fp8 ? "FP8 pool" : "f32 pool",
                                            spec.hadamard ? " + Hadamard FP4" : "", t);
  const int32_t position = R * 64 - 1;  // closes a window; emitted row 63 = the last row of page 0
  DecodeStep step;
  absl::Status st = step.Make(be, t, position, sets);
  const int64_t slots = sets * t;
  absl::StatusOr<kernels::Buffer> state_kv = be.Allocate(slots * stride * 4, kernels::MemoryKind::kState),
                                  state_score = be.Allocate(slots * stride * 4, kernels::MemoryKind::kState),
                                  pool = be.Allocate(slots * page_bytes, kernels::MemoryKind::kKvCache);
  std::vector<int32_t> table(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::vector<float> norm_w = RandomFloats(d, seed + 3, 0.1f);
  for (float& w : norm_w) w += 1.f;
  std::vector<float> inv_freq(static_cast<size_t>(s.rope_pairs));
  for (int i = 0; i < s.rope_pairs; ++i) {
    inv_freq[static_cast<size_t>(i)] = static_cast<float>(std::pow(s.compress_rope_theta, -static_cast<double>(i) / s.rope_pairs));
  }
  absl::StatusOr<kernels::Buffer> tab = UploadVector(be, table), kv = UploadVector(be, RandomFloats(t * cd, seed)),
                                  gate = UploadVector(be, RandomFloats(t * cd, seed + 1)),
                                  ape = UploadVector(be, RandomFloats(R * cd, seed + 2, 0.5f)),
                                  norm = UploadVector(be, norm_w), freq = UploadVector(be, inv_freq);
  for (const absl::Status& e : {st, state_kv.status(), state_score.status(), pool.status(), tab.status(), kv.status(),
                                gate.status(), ape.status(), norm.status(), freq.status()}) {
    if (!e.ok()) return b.Fail("cache", spec.op, shape, e);
  }
  // Mid-sequence state: finite kv and score rows (the window the step closes).
  st = FillTiledF32(be, state_kv->as<float>(), slots * stride, RandomFloats(std::min<int64_t>(slots * stride, 1 << 20), seed + 4));
  if (st.ok()) {
    st = FillTiledF32(be, state_score->as<float>(), slots * stride,
                      RandomFloats(std::min<int64_t>(slots * stride, 1 << 20), seed + 5));
  }
  if (!st.ok()) return b.Fail("cache", spec.op, shape, st);

  const kernels::CompressorArgs base{
      .state_kv = state_kv->as<float>(),
      .state_score = state_score->as<float>(),
      .state_stride = stride,
      .kv = kv->as<const float>(),
      .gate = gate->as<const float>(),
      .ape = ape->as<const float>(),
      .norm_w = norm->as<const float>(),
      .inv_freq = freq->as<const float>(),
      .cache = {.base = pool->as<uint8_t>(), .format = format, .dim = d, .page_rows = P, .page_bytes = page_bytes},
      .tables = {},
      .step = {},
      .ratio = R,
      .d = d,
      .pairs = s.rope_pairs,
      .eps = s.eps,
      .hadamard_fp4 = spec.hadamard};
  const int32_t* tabp = tab->as<const int32_t>();
  const DecodeStep* stp = &step;
  Case c{.family = "cache",
         .op = spec.op,
         .shape = shape,
         .params = {{"ratio", R}, {"d", d}, {"fp8", spec.fp8}, {"hadamard_fp4", spec.hadamard}, {"t", t}},
         .max_sets = sets,
         .rotated_bytes_per_set = state_bytes * t};
  c.enqueue = [&be, base, tabp, stp, t](int set) {
    kernels::CompressorArgs a = base;
    a.tables = {.pages = tabp + set * t, .stride = 1};
    a.step = stp->Index(t, set);
    be.ops().Compressor(a);
  };
  const double row_bytes = spec.fp8 ? sm::kRowBytes : 4.0 * d;
  c.bytes = [state_bytes, cd, row_bytes, t](int) { return t * (state_bytes + 8.0 * cd + 8.0 * cd + row_bytes); };
  float* skv = state_kv->as<float>();
  float* ssc = state_score->as<float>();
  const uint8_t* poolp = pool->as<const uint8_t>();
  c.check = [&be, skv, ssc, poolp, spec, t, stride, page_bytes, P, d]() -> absl::Status {
    if (absl::Status e = CheckFinite(be, skv, t * stride, "state kv"); !e.ok()) return e;
    if (absl::Status e = CheckFinite(be, ssc, t * stride, "state score"); !e.ok()) return e;
    // Set 0's emitted rows: row 63 of page v for sequence v.
    if (spec.fp8) return CheckFp8Rows(be, poolp, P, P - 1, t, P);
    for (int64_t v = 0; v < t; ++v) {
      const float* row = reinterpret_cast<const float*>(poolp + v * page_bytes) + int64_t{P - 1} * d;
      if (absl::Status e = CheckFinite(be, row, d, absl::StrCat("emitted row of sequence ", v)); !e.ok()) return e;
    }
    return absl::OkStatus();
  };
  // The step must outlive the case (the lambdas point at it): it is a local of this function, and Run returns first.
  b.Run(be, c);
}

}  // namespace

void RunCacheCases(Bench& b) {
  const Shapes& s = b.shapes;
  const int dh = static_cast<int>(s.head_dim), id = static_cast<int>(s.index_dim);
  const CompressorSpec specs[] = {{"compressor_r4", 4, dh, true, false},
                                  {"compressor_r128", 128, dh, true, false},
                                  {"indexer_compressor_r4", 4, id, false, true}};
  uint64_t seed = b.seed * 6000;
  for (int64_t t : b.sweep.dense_tokens) {
    RunKvWrite(b, t, seed += 3);
    for (const CompressorSpec& spec : specs) RunCompressor(b, spec, t, seed += 5);
  }
}

}  // namespace dsv4::bench
