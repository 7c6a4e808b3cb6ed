// The attention family of dsv4-ops-bench: the Attention op in production mode (584-byte FP8 rows), B decode tokens
// of B sequences, for layers of ratio 0 (window only), 4 (window + the indexer's Ksel selected rows) and 128
// (window + every compressed row, at each context of --attention_contexts), with each sparse-MLA kernel of
// --attention_kernels (a backend per kernel: --attention-kernel is a construction option of the CUDA backend).
// Every pool row is a real encode (kernels/sparse_mla EncodeKvRow); a token attends its 127 ring rows and its own
// staging row. Input sets are other sequences (other pages; for ratio 4, other selections scattered over a 4x
// larger region), so a replay reads more than the L2; q and the output are one buffer each.
// Bytes moved per call = B x ((W + compressed rows) x 584 + q and out in f32) (+ 4 B per selected id).
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/ops/bench.h"
#include "bench/ops/synth.h"
#include "common/status_macros.h"
#include "kernels/backend_factory.h"
#include "kernels/sparse_mla/kv_row_format.h"

namespace dsv4::bench {
namespace {

namespace sm = kernels::sparse_mla;

constexpr int kScatter = 4;  // ratio 4: a sequence's Ksel rows are picked from kScatter x Ksel rows

struct AttnCase {
  int ratio = 0;
  int64_t batch = 1, context = 8192;
};

// Compressed rows a token reads.
int64_t CompressedRows(const Shapes& s, const AttnCase& c) {
  return c.ratio == 4 ? s.index_topk : c.ratio == 128 ? c.context / 128 : 0;
}
int64_t WindowPagesPerSeq(const Shapes& s) { return (s.window + s.page_rows - 1) / s.page_rows; }
int64_t CompressedPagesPerSeq(const Shapes& s, const AttnCase& c) {
  const int64_t rows = c.ratio == 4 ? kScatter * s.index_topk : CompressedRows(s, c);
  return (rows + s.page_rows - 1) / s.page_rows;
}
double SetBytes(const Shapes& s, const AttnCase& c) {
  return static_cast<double>(c.batch) * (s.window + CompressedRows(s, c)) * sm::kRowBytes;
}

// One FP8 pool holding the window pages, the staging pages after them, then the compressed pages (their own view).
struct Pools {
  kernels::Buffer memory;
  int64_t window_pages = 0, staging_pages = 0, compressed_pages = 0, page_bytes = 0;
  kernels::KvCacheView Window() const {
    return {.base = memory.as<uint8_t>(), .format = kernels::KvFormat::kFp8Row584, .dim = sm::kKvDim,
            .page_rows = page_rows, .page_bytes = page_bytes};
  }
  kernels::KvCacheView Compressed() const {
    kernels::KvCacheView v = Window();
    v.base += (window_pages + staging_pages) * page_bytes;
    return v;
  }
  int page_rows = 64;
};

absl::StatusOr<Pools> MakePools(Bench& b, kernels::Backend& be, const std::vector<AttnCase>& cases) {
  const Shapes& s = b.shapes;
  Pools p;
  p.page_rows = s.page_rows;
  p.page_bytes = sm::KvPageStrideBytes(s.page_rows);
  int64_t max_b = 1;
  for (const AttnCase& c : cases) {
    const int64_t seqs = b.SetsFor(SetBytes(s, c)) * c.batch;
    p.window_pages = std::max(p.window_pages, seqs * WindowPagesPerSeq(s));
    p.compressed_pages = std::max(p.compressed_pages, seqs * CompressedPagesPerSeq(s, c));
    max_b = std::max(max_b, c.batch);
  }
  p.staging_pages = (max_b + s.page_rows - 1) / s.page_rows;
  const int64_t pages = p.window_pages + p.staging_pages + std::max<int64_t>(1, p.compressed_pages);
  DSV4_ASSIGN_OR_RETURN(p.memory, be.Allocate(pages * p.page_bytes, kernels::MemoryKind::kKvCache));
  DSV4_RETURN_IF_ERROR(FillTiled(be, p.memory.data(), pages * p.page_bytes, Fp8PageImage(64, s.page_rows, b.seed * 4000)));
  absl::StatusOr<Pools> result(std::move(p));
  return result;
}

// The index arrays of one case, for all its sets (sequence v = set * B + b).
struct Indices {
  std::vector<int32_t> window_tables, compressed_tables, selected, count;
  int64_t cpps = 0;
};

Indices MakeIndices(const Shapes& s, const AttnCase& c, int sets, uint64_t seed) {
  Indices ix;
  const int64_t seqs = sets * c.batch, wpps = WindowPagesPerSeq(s), P = s.page_rows, K = s.index_topk;
  ix.cpps = std::max<int64_t>(1, CompressedPagesPerSeq(s, c));
  ix.window_tables.resize(static_cast<size_t>(seqs * wpps));
  for (int64_t i = 0; i < seqs * wpps; ++i) ix.window_tables[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  ix.compressed_tables.resize(static_cast<size_t>(seqs * ix.cpps));
  for (int64_t i = 0; i < seqs * ix.cpps; ++i) ix.compressed_tables[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  ix.selected.assign(static_cast<size_t>(std::max<int64_t>(1, seqs * K)), -1);
  ix.count.assign(static_cast<size_t>(seqs), 0);
  if (c.ratio == 4) {
    Rng rng(seed);
    const int64_t region = ix.cpps * P;
    std::vector<int32_t> rows(static_cast<size_t>(region));
    for (int64_t v = 0; v < seqs; ++v) {
      for (int64_t r = 0; r < region; ++r) rows[static_cast<size_t>(r)] = static_cast<int32_t>(v * region + r);
      for (int64_t i = 0; i < K; ++i) std::swap(rows[static_cast<size_t>(i)], rows[static_cast<size_t>(i + rng.Int(region - i))]);
      std::sort(rows.begin(), rows.begin() + K);  // the indexer writes ascending ids
      std::copy(rows.begin(), rows.begin() + K, ix.selected.begin() + v * K);
      ix.count[static_cast<size_t>(v)] = static_cast<int32_t>(K);
    }
  }
  return ix;
}

void RunCase(Bench& b, kernels::Backend& be, const std::string& kernel, const Pools& pools, const AttnCase& c,
             uint64_t seed) {
  const Shapes& s = b.shapes;
  const int64_t B = c.batch, H = s.heads, Dh = s.head_dim, K = s.index_topk, wpps = WindowPagesPerSeq(s);
  const int sets = b.SetsFor(SetBytes(s, c));
  const std::string op = "attention_" + kernel;
  const std::string shape = absl::StrFormat("ratio %d, B=%d, H=%d%s", c.ratio, B, H,
                                            c.ratio == 128 ? absl::StrFormat(", context %d", c.context) : std::string());
  if (sets * B * wpps > pools.window_pages || sets * B * CompressedPagesPerSeq(s, c) > pools.compressed_pages ||
      B > pools.staging_pages * s.page_rows) {  // MakePools sized the pools for every case
    return b.Fail("attention", op, shape, absl::InternalError("the case needs more pages than the pools have"));
  }
  const Indices ix = MakeIndices(s, c, sets, seed);
  std::vector<int32_t> pos(static_cast<size_t>(B), static_cast<int32_t>(c.context - 1)), seq(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) seq[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const std::vector<int32_t> len(static_cast<size_t>(B), 1);
  absl::StatusOr<kernels::Buffer> wt = UploadVector(be, ix.window_tables), ct = UploadVector(be, ix.compressed_tables),
                                  sel = UploadVector(be, ix.selected), cnt = UploadVector(be, ix.count),
                                  pos_b = UploadVector(be, pos), seq_b = UploadVector(be, seq),
                                  len_b = UploadVector(be, len), q = UploadVector(be, RandomFloats(B * H * Dh, seed)),
                                  sink = UploadVector(be, RandomFloats(H, seed + 1)),
                                  out = be.Allocate(B * H * Dh * 4, kernels::MemoryKind::kWorkspace);
  for (const absl::Status& st : {wt.status(), ct.status(), sel.status(), cnt.status(), pos_b.status(), seq_b.status(),
                                 len_b.status(), q.status(), sink.status(), out.status()}) {
    if (!st.ok()) return b.Fail("attention", op, shape, st);
  }
  const kernels::StepIndex step{.pos = pos_b->as<const int32_t>(), .seq = seq_b->as<const int32_t>(),
                                .seq_first = seq_b->as<const int32_t>(), .seq_len = len_b->as<const int32_t>(),
                                .state_slot = seq_b->as<const int32_t>(), .t = B, .b = B, .max_seq_len = 1};
  const kernels::AttentionArgs base{
      .q = q->as<const float>(),
      .window = pools.Window(),
      .window_tables = {},
      .staging_row0 = static_cast<int32_t>(pools.window_pages * s.page_rows),
      .window_size = static_cast<int>(s.window),
      .compressed = c.ratio > 0 ? pools.Compressed() : kernels::KvCacheView{},
      .compressed_tables = {},
      .compressed_ratio = c.ratio,
      .selected = nullptr,
      .selected_count = nullptr,
      .ksel = c.ratio == 4 ? K : 0,
      .max_compressed = c.ratio == 128 ? s.max_context / 128 : (c.ratio == 4 ? K : 0),
      .step = step,
      .sink = sink->as<const float>(),
      .out = out->as<float>(),
      .heads = H,
      .dim = Dh,
      .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)))};
  const int32_t* wtp = wt->as<const int32_t>();
  const int32_t* ctp = ct->as<const int32_t>();
  const int32_t* selp = sel->as<const int32_t>();
  const int32_t* cntp = cnt->as<const int32_t>();
  const int64_t cpps = ix.cpps, kc = CompressedRows(s, c);
  Case cs{.family = "attention",
          .op = op,
          .shape = shape,
          .params = {{"kernel", kernel}, {"ratio", c.ratio}, {"b", B}, {"heads", H}, {"context", c.context},
                     {"window_rows", s.window}, {"compressed_rows", kc}},
          .max_sets = sets,
          .rotated_bytes_per_set = SetBytes(s, c)};
  cs.enqueue = [&be, base, wtp, ctp, selp, cntp, B, wpps, cpps, K](int set) {
    kernels::AttentionArgs a = base;
    const int64_t v0 = set * B;
    a.window_tables = {.pages = wtp + v0 * wpps, .stride = wpps};
    if (a.compressed_ratio == 128) a.compressed_tables = {.pages = ctp + v0 * cpps, .stride = cpps};
    if (a.compressed_ratio == 4) {
      a.selected = selp + v0 * K;
      a.selected_count = cntp + v0;
    }
    be.ops().Attention(a);
  };
  const double per_token = (s.window + kc) * static_cast<double>(sm::kRowBytes) + 8.0 * H * Dh +
                           (c.ratio == 4 ? 4.0 * K : 0.0);
  cs.bytes = [per_token, B](int) { return per_token * B; };
  float* outp = out->as<float>();
  cs.prepare = [&be, outp, B, H, Dh] {
    Poison(be, outp, B * H * Dh);
    return be.Synchronize();
  };
  cs.check = [&be, outp, B, H, Dh] { return CheckFinite(be, outp, B * H * Dh, "out"); };
  b.Run(be, cs);
}

}  // namespace

void RunAttentionCases(Bench& b) {
  const Sweep& sw = b.sweep;
  std::vector<AttnCase> cases;
  const int64_t first_ctx = sw.attention_contexts.empty() ? 32768 : sw.attention_contexts.front();
  for (int ratio : {0, 4, 128}) {
    for (int64_t ctx : sw.attention_contexts) {
      if (ratio != 128 && ctx != first_ctx) continue;
      for (int64_t batch : sw.attention_batches) cases.push_back({.ratio = ratio, .batch = batch, .context = ctx});
    }
  }
  if (cases.empty()) return;
  for (const std::string& kernel : sw.attention_kernels) {
    // The primary backend runs the MMA kernel (or is the CPU); another kernel gets a backend of its own.
    std::unique_ptr<kernels::Backend> own;
    kernels::Backend* be = &b.backend;
    if (b.cuda && kernel != "mma") {
      absl::StatusOr<std::unique_ptr<kernels::Backend>> made =
          kernels::MakeBackend({.name = "cuda", .attention_kernel = kernel});
      absl::Status st = made.ok() ? (*made)->Reserve(b.limits) : made.status();
      if (!st.ok()) {
        b.Fail("attention", "attention_" + kernel, "backend", st);
        continue;
      }
      own = *std::move(made);
      be = own.get();
    }
    absl::StatusOr<Pools> pools = MakePools(b, *be, cases);
    if (!pools.ok()) {
      b.Fail("attention", "attention_" + kernel, "pools", pools.status());
      continue;
    }
    uint64_t seed = b.seed * 4000;
    for (const AttnCase& c : cases) RunCase(b, *be, kernel, *pools, c, seed += 13);
  }
}

}  // namespace dsv4::bench
