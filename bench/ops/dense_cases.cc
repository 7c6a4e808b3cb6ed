// The dense family of dsv4-ops-bench: RMSNorm, RoPE, HadamardFp4, mHC pre and post at each T of --dense_tokens,
// at the shapes the attention and FFN sublayers use them. Only HcPre reads a weight worth rotating (its fn matrix,
// [(2 + S) S, S D] f32, 1.5 MB): one copy per input set. Everything else works on activations (one buffer each,
// L2-hot in a step). Bytes moved per call = what the op reads and writes once (in-place ops count both).
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/ops/bench.h"
#include "bench/ops/synth.h"

namespace dsv4::bench {
namespace {

// Buffers of random floats (and outputs) that a family's cases share; a failed allocation is kept in status.
struct Arena {
  kernels::Backend& be;
  std::vector<kernels::Buffer> held{};
  absl::Status status{};
  float* Random(int64_t n, uint64_t seed, float stddev = 1.f) {
    absl::StatusOr<kernels::Buffer> b = UploadVector(be, RandomFloats(n, seed, stddev));
    return Keep(std::move(b));
  }
  float* Zeros(int64_t n) { return Keep(be.Allocate(n * 4, kernels::MemoryKind::kWorkspace)); }
  float* Keep(absl::StatusOr<kernels::Buffer> b) {
    if (!b.ok()) {
      if (status.ok()) status = b.status();
      return nullptr;
    }
    held.push_back(*std::move(b));
    return held.back().as<float>();
  }
};

std::vector<float> InvFreq(double theta, int pairs) {
  std::vector<float> f(static_cast<size_t>(pairs));
  for (int i = 0; i < pairs; ++i) f[static_cast<size_t>(i)] = static_cast<float>(std::pow(theta, -2.0 * i / (2.0 * pairs)));
  return f;
}

Case Dense(const std::string& op, const std::string& shape, int64_t t, double bytes) {
  Case c{.family = "dense", .op = op, .shape = absl::StrFormat("%s T=%d", shape, t), .params = {{"t", t}}};
  c.bytes = [bytes](int) { return bytes; };
  return c;
}

}  // namespace

void RunDenseCases(Bench& b) {
  kernels::Backend& be = b.backend;
  const Shapes& s = b.shapes;
  int64_t max_t = 1;
  for (int64_t t : b.sweep.dense_tokens) max_t = std::max(max_t, t);
  const int64_t D = s.hidden, S = s.hc, H = s.heads, Dh = s.head_dim, IH = s.index_heads, ID = s.index_dim;
  const int64_t mix = (2 + S) * S;
  Arena a{.be = be};
  uint64_t seed = b.seed * 5000;
  // RMSNorm inputs / outputs sized for the largest use (T x H rows of Dh).
  float* x = a.Random(max_t * std::max(D, H * Dh), ++seed);
  float* out = a.Zeros(max_t * std::max(D, H * Dh));
  float* norm_w = a.Random(D, ++seed, 0.1f);
  float* rope_x = a.Random(max_t * std::max(H * Dh, IH * ID), ++seed);
  float* idx_q = a.Random(max_t * IH * ID, ++seed);
  absl::StatusOr<kernels::Buffer> pos_b = UploadVector(be, std::vector<int32_t>(static_cast<size_t>(max_t), 4095));
  float* inv_freq = a.Keep(UploadVector(be, InvFreq(s.rope_theta, s.rope_pairs)));
  float* streams = a.Random(max_t * S * D, ++seed);
  float* streams_out = a.Zeros(max_t * S * D);
  float* y = a.Random(max_t * D, ++seed);
  float* post = a.Random(max_t * S, ++seed, 0.5f);
  float* comb = a.Random(max_t * S * S, ++seed, 0.5f);
  float* u = a.Zeros(max_t * D);
  float* base = a.Random(mix, ++seed, 0.1f);
  float* scale = a.Keep(UploadVector(be, std::vector<float>{1.f, 1.f, 1.f}));
  // HcPre's fn: one copy per set, tiled from one host image.
  const int64_t fn_floats = mix * S * D;
  const int fn_sets = b.SetsFor(4.0 * static_cast<double>(fn_floats));
  float* fn = a.Zeros(fn_sets * fn_floats);
  if (a.status.ok() && !pos_b.ok()) a.status = pos_b.status();
  if (a.status.ok()) a.status = FillTiledF32(be, fn, fn_sets * fn_floats, RandomFloats(fn_floats, ++seed, 0.02f));
  if (!a.status.ok()) return b.Fail("dense", "setup", "buffers", a.status);
  const int32_t* pos = pos_b->as<const int32_t>();

  for (int64_t t : b.sweep.dense_tokens) {
    // RMSNorm: the sublayer input [T, D] (weighted), q_norm [T, q_lora], the per-head q norm [T*H, Dh] (no weight).
    struct Norm {
      const char* op;
      int64_t rows, dim;
      bool weighted;
    };
    for (const Norm& n : {Norm{"rmsnorm_hidden", t, D, true}, Norm{"rmsnorm_q_lora", t, s.q_lora, true},
                          Norm{"rmsnorm_q_heads", t * H, Dh, false}}) {
      Case c = Dense(n.op, absl::StrFormat("[%d, %d]", n.rows, n.dim), t, 8.0 * n.rows * n.dim + 4.0 * n.dim);
      c.enqueue = [&be, x, out, norm_w, n, &s](int) {
        be.ops().RmsNorm({.x = x, .w = n.weighted ? norm_w : nullptr, .out = out, .rows = n.rows, .dim = n.dim,
                          .eps = s.eps});
      };
      c.prepare = [&be, out, n] {
        Poison(be, out, n.rows * n.dim);
        return be.Synchronize();
      };
      c.check = [&be, out, n] { return CheckFinite(be, out, n.rows * n.dim, "out"); };
      b.Run(be, c);
    }
    // RoPE in place on the last 2 * pairs dims of each row: q [T, H, Dh], the key [T, 1, Dh], indexer q [T, IH, ID].
    struct Rope {
      const char* op;
      int64_t heads, row_dim;
    };
    for (const Rope& r : {Rope{"rope_q", H, Dh}, Rope{"rope_kv", 1, Dh}, Rope{"rope_indexer_q", IH, ID}}) {
      Case c = Dense(r.op, absl::StrFormat("[%d, %d, %d]", t, r.heads, r.row_dim), t,
                     8.0 * t * r.heads * 2 * s.rope_pairs + 4.0 * t);
      c.enqueue = [&be, rope_x, pos, inv_freq, r, t, &s](int) {
        be.ops().Rope({.x = rope_x, .pos = pos, .inv_freq = inv_freq, .t = t, .heads = r.heads, .row_dim = r.row_dim,
                       .pairs = s.rope_pairs});
      };
      c.check = [&be, rope_x, r, t] { return CheckFinite(be, rope_x, t * r.heads * r.row_dim, "x"); };
      b.Run(be, c);
    }
    {  // The indexer q's Hadamard + FP4 simulation, in place.
      Case c = Dense("hadamard_fp4", absl::StrFormat("[%d, %d]", t * IH, ID), t, 8.0 * t * IH * ID);
      c.enqueue = [&be, idx_q, t, IH, ID](int) { be.ops().HadamardFp4({.x = idx_q, .rows = t * IH, .dim = ID}); };
      c.check = [&be, idx_q, t, IH, ID] { return CheckFinite(be, idx_q, t * IH * ID, "x"); };
      b.Run(be, c);
    }
    {  // mHC pre: mixes of the streams (fn rotated), Sinkhorn, the sublayer input.
      Case c = Dense("hc_pre", absl::StrFormat("S=%d D=%d, fn [%d, %d]", S, D, mix, S * D), t,
                     4.0 * fn_floats + 4.0 * t * (S * D + D + S + S * S));
      c.max_sets = fn_sets;
      c.rotated_bytes_per_set = 4.0 * static_cast<double>(fn_floats);
      c.enqueue = [&be, streams, fn, fn_floats, base, scale, u, post, comb, t, S, D, &s](int set) {
        be.ops().HcPre({.x = streams, .fn = fn + set * fn_floats, .base = base, .scale = scale, .u = u, .post = post,
                        .comb = comb, .t = t, .s = S, .d = D, .sinkhorn_iters = s.sinkhorn_iters, .norm_eps = s.eps,
                        .hc_eps = s.hc_eps});
      };
      c.prepare = [&be, u, t, D] {
        Poison(be, u, t * D);
        return be.Synchronize();
      };
      c.check = [&be, u, post, comb, t, S, D]() -> absl::Status {
        if (absl::Status st = CheckFinite(be, u, t * D, "u"); !st.ok()) return st;
        if (absl::Status st = CheckFinite(be, post, t * S, "post"); !st.ok()) return st;
        return CheckFinite(be, comb, t * S * S, "comb");
      };
      b.Run(be, c);
    }
    {  // mHC post: the new streams from the old ones, the sublayer output and the mixes.
      Case c = Dense("hc_post", absl::StrFormat("S=%d D=%d", S, D), t, 4.0 * t * (2 * S * D + D + S + S * S));
      c.enqueue = [&be, streams, y, post, comb, streams_out, t, S, D](int) {
        be.ops().HcPost({.x = streams, .y = y, .post = post, .comb = comb, .x_out = streams_out, .t = t, .s = S,
                         .d = D});
      };
      c.prepare = [&be, streams_out, t, S, D] {
        Poison(be, streams_out, t * S * D);
        return be.Synchronize();
      };
      c.check = [&be, streams_out, t, S, D] { return CheckFinite(be, streams_out, t * S * D, "x_out"); };
      b.Run(be, c);
    }
  }
}

}  // namespace dsv4::bench
