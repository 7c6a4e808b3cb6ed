// The indexer family of dsv4-ops-bench: the lightning indexer (scores over every visible indexer row, top-Ksel) for
// B decode tokens at each context of --indexer_contexts, with the row bound planned for --max_context (as the model
// passes it), plus cases whose pages are spread over a pool 8x larger than the context needs: their time must
// match the plain case (the op's work follows the rows that exist, not the pool or the bound).
// The indexer pool holds production-like rows: random normals put through the Hadamard + FP4 simulation
// (HadamardFp4 on the backend). Input sets are other sequences (other pages of the pool), so a replay reads more
// than the L2; q and w are one buffer (L2-hot in a step).
// Bytes moved per call = the visible rows (B x context/4 x ID x 4) + q + w + the selection written.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/ops/bench.h"
#include "bench/ops/synth.h"

namespace dsv4::bench {
namespace {

struct IndexerCase {
  int64_t batch = 1, context = 8192;
  int factor = 1;  // pool pages per page the sequences use
};

// Pages of the indexer pool one case uses.
int64_t PoolPages(const Bench& b, const IndexerCase& c) {
  const int64_t P = b.shapes.page_rows, rows = c.context / 4, pps = (rows + P - 1) / P;
  const double set_bytes = static_cast<double>(c.batch) * rows * b.shapes.index_dim * 4;
  return b.SetsFor(set_bytes) * c.batch * pps * c.factor;
}

Result RunCase(Bench& b, const IndexerCase& c, const kernels::Buffer& pool, int64_t pool_pages, uint64_t seed) {
  kernels::Backend& be = b.backend;
  const Shapes& s = b.shapes;
  const int64_t B = c.batch, P = s.page_rows, IH = s.index_heads, ID = s.index_dim, K = s.index_topk;
  const int64_t rows = c.context / 4, pps = (rows + P - 1) / P;
  const int64_t stride = std::max(pps, (s.max_context / 4 + P - 1) / P);  // a table row sized for the bound
  const double set_bytes = static_cast<double>(B) * rows * ID * 4;
  const int sets = b.SetsFor(set_bytes);
  const std::string op = c.factor == 1 ? "indexer" : absl::StrCat("indexer_pool", c.factor, "x");
  const std::string shape = absl::StrFormat("B=%d context %d (%d rows), IH=%d ID=%d top-%d", B, c.context, rows, IH,
                                            ID, K);
  Result failed{.family = "indexer", .op = op, .shape = shape};

  // Sequence v = set * B + b reads pages (v * pps + j) * factor.
  std::vector<int32_t> tables(static_cast<size_t>(sets * B * stride), 0);
  for (int64_t v = 0; v < sets * B; ++v) {
    for (int64_t j = 0; j < pps; ++j) {
      tables[static_cast<size_t>(v * stride + j)] = static_cast<int32_t>(((v * pps + j) * c.factor) % pool_pages);
    }
  }
  if (sets * B * pps * c.factor > pool_pages) {  // PoolPages sized the pool for every case
    failed.error = absl::StrCat("internal: the case needs ", sets * B * pps * c.factor, " pages, the pool has ",
                                pool_pages);
    b.report.Add(failed);
    return failed;
  }
  std::vector<int32_t> pos(static_cast<size_t>(B), static_cast<int32_t>(c.context - 1)), seq(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) seq[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  const std::vector<int32_t> len(static_cast<size_t>(B), 1);
  absl::StatusOr<kernels::Buffer> tab = UploadVector(be, tables), pos_b = UploadVector(be, pos),
                                  seq_b = UploadVector(be, seq), len_b = UploadVector(be, len),
                                  q = UploadVector(be, RandomFloats(B * IH * ID, seed)),
                                  w = UploadVector(be, RandomFloats(B * IH, seed + 1)),
                                  sel = be.Allocate(B * K * 4, kernels::MemoryKind::kWorkspace),
                                  cnt = be.Allocate(B * 4, kernels::MemoryKind::kWorkspace);
  for (const absl::Status& st : {tab.status(), pos_b.status(), seq_b.status(), len_b.status(), q.status(),
                                 w.status(), sel.status(), cnt.status()}) {
    if (!st.ok()) {
      failed.error = st.ToString();
      b.report.Add(failed);
      return failed;
    }
  }
  be.ops().HadamardFp4({.x = q->as<float>(), .rows = B * IH, .dim = ID});  // production-mode q

  const kernels::StepIndex step{.pos = pos_b->as<const int32_t>(), .seq = seq_b->as<const int32_t>(),
                                .seq_first = seq_b->as<const int32_t>(), .seq_len = len_b->as<const int32_t>(),
                                .state_slot = seq_b->as<const int32_t>(), .t = B, .b = B, .max_seq_len = 1};
  const kernels::KvCacheView view{.base = pool.as<uint8_t>(), .format = kernels::KvFormat::kF32,
                                  .dim = static_cast<int>(ID), .page_rows = static_cast<int>(P),
                                  .page_bytes = kernels::KvPageBytes(kernels::KvFormat::kF32, static_cast<int>(ID),
                                                                     static_cast<int>(P))};
  const int32_t* tabp = tab->as<const int32_t>();
  int32_t* selp = sel->as<int32_t>();
  int32_t* cntp = cnt->as<int32_t>();
  const float* qp = q->as<const float>();
  const float* wp = w->as<const float>();
  const float weight_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(ID * IH)));
  const int64_t max_rows = s.max_context / 4;

  Case cs{.family = "indexer",
          .op = op,
          .shape = shape,
          .params = {{"b", B}, {"context", c.context}, {"rows", rows}, {"pool_factor", c.factor},
                     {"pool_pages", pool_pages}, {"max_rows", max_rows}, {"heads", IH}, {"dim", ID}, {"topk", K}},
          .max_sets = sets,
          .rotated_bytes_per_set = set_bytes};
  cs.enqueue = [&be, step, view, tabp, selp, cntp, qp, wp, weight_scale, max_rows, B, stride, IH, ID, K](int set) {
    const kernels::BlockTables t{.pages = tabp + set * B * stride, .stride = stride};
    be.ops().Indexer({.q = qp, .w = wp, .weight_scale = weight_scale, .cache = view, .index_tables = t,
                      .target_tables = t, .step = step, .selected = selp, .selected_count = cntp, .heads = IH,
                      .dim = ID, .k = K, .max_rows = max_rows});
  };
  cs.bytes = [B, rows, ID, IH, K](int) { return 4.0 * B * (rows * ID + IH * ID + IH + K + 1); };
  const int64_t pool_rows = pool_pages * P, want = std::min(K, rows);
  cs.check = [&be, selp, cntp, B, K, want, pool_rows]() -> absl::Status {
    absl::StatusOr<std::vector<int32_t>> n = DownloadVector<int32_t>(be, cntp, B);
    absl::StatusOr<std::vector<int32_t>> ids = DownloadVector<int32_t>(be, selp, B * K);
    if (!n.ok() || !ids.ok()) return n.ok() ? ids.status() : n.status();
    for (int64_t t = 0; t < B; ++t) {
      if ((*n)[static_cast<size_t>(t)] != want) {
        return absl::DataLossError(absl::StrCat("token ", t, " kept ", (*n)[static_cast<size_t>(t)], " rows, want ", want));
      }
      for (int64_t i = 0; i < K; ++i) {
        const int32_t id = (*ids)[static_cast<size_t>(t * K + i)];
        if (i < want ? (id < 0 || id >= pool_rows) : id != -1) {
          return absl::DataLossError(absl::StrCat("token ", t, " entry ", i, " is ", id));
        }
      }
    }
    return absl::OkStatus();
  };
  return b.Run(be, cs);
}

}  // namespace

void RunIndexerCases(Bench& b) {
  kernels::Backend& be = b.backend;
  const Sweep& sw = b.sweep;
  std::vector<IndexerCase> cases;
  for (int64_t ctx : sw.indexer_contexts) {
    for (int64_t batch : sw.indexer_batches) {
      cases.push_back({.batch = batch, .context = ctx});
      const bool pool8x = ctx == sw.indexer_contexts.front() &&
                          std::find(sw.indexer_pool8x_batches.begin(), sw.indexer_pool8x_batches.end(), batch) !=
                              sw.indexer_pool8x_batches.end();
      if (pool8x) cases.push_back({.batch = batch, .context = ctx, .factor = 8});
    }
  }
  if (cases.empty()) return;
  int64_t pages = 1;
  for (const IndexerCase& c : cases) pages = std::max(pages, PoolPages(b, c));
  const int64_t P = b.shapes.page_rows, ID = b.shapes.index_dim;
  const int64_t page_bytes = kernels::KvPageBytes(kernels::KvFormat::kF32, static_cast<int>(ID), static_cast<int>(P));
  const std::string what = absl::StrFormat("indexer pool of %d pages (%.0f MB)", pages, pages * page_bytes / 1e6);
  absl::StatusOr<kernels::Buffer> pool = be.Allocate(pages * page_bytes, kernels::MemoryKind::kKvCache);
  absl::Status st = pool.ok() ? FillTiledF32(be, pool->as<float>(), pages * page_bytes / 4,
                                             RandomFloats(int64_t{2} << 20, b.seed * 3000))
                              : pool.status();
  if (st.ok()) {
    be.ops().HadamardFp4({.x = pool->as<float>(), .rows = pages * P, .dim = ID});
    st = be.Synchronize();
  }
  if (!st.ok()) return b.Fail("indexer", "indexer", what, st);

  Result plain;
  uint64_t seed = b.seed * 3000;
  for (const IndexerCase& c : cases) {
    const Result r = RunCase(b, c, *pool, pages, seed += 7);
    if (c.factor == 1) {
      plain = r;
    } else if (r.median_us > 0 && plain.median_us > 0) {
      b.report.Note(absl::StrFormat(
          "indexer B=%d context %d, pool %dx the context: %.2f us vs %.2f us with the plain pool (ratio %.3f; "
          "plain p10-p90 %.2f-%.2f us)",
          c.batch, c.context, c.factor, r.median_us, plain.median_us, r.median_us / plain.median_us, plain.p10_us,
          plain.p90_us));
    }
  }
}

}  // namespace dsv4::bench
