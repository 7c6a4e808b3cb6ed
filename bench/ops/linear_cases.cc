// The linear family of dsv4-ops-bench: every linear of one layer and the head, in its checkpoint format, at each
// T of --tokens. Each weight is prepared several times (PrepareLinear of the same host bytes) so that one replay
// cycles through more weight bytes than the L2; x and y are one buffer each (activations are L2-hot in a step).
// Bytes moved per call = the prepared weight (e4m3 codes + f32 block scales, or bf16) + x [T, Kin] f32 read +
// y [T, N] f32 written.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "bench/ops/bench.h"
#include "bench/ops/synth.h"

namespace dsv4::bench {
namespace {

using kernels::WeightFormat;

struct LinearSpec {
  std::string op;
  WeightFormat format;
  int64_t n = 0, k = 0;  // per group
  int groups = 1;
  std::string note;
};

std::vector<LinearSpec> Specs(const Shapes& s) {
  const WeightFormat fp8 = WeightFormat::kFp8Block128, bf16 = WeightFormat::kBF16;
  return {
      {"wq_a", fp8, s.q_lora, s.hidden, 1, ""},
      {"wq_b", fp8, s.heads * s.head_dim, s.q_lora, 1, ""},
      {"wkv", fp8, s.head_dim, s.hidden, 1, ""},
      {"wo_a", fp8, s.o_lora, s.group_in, static_cast<int>(s.groups), "grouped: G blocks of [N, Kin]"},
      {"wo_b", fp8, s.hidden, s.groups * s.o_lora, 1, ""},
      {"compressor_r4.wkv|wgate", bf16, 2 * s.head_dim, s.hidden, 1, "x2 per ratio-4 layer"},
      {"compressor_r128.wkv|wgate", bf16, s.head_dim, s.hidden, 1, "x2 per ratio-128 layer"},
      {"indexer.wq_b", fp8, s.index_heads * s.index_dim, s.q_lora, 1, ""},
      {"indexer.weights_proj", bf16, s.index_heads, s.hidden, 1, ""},
      {"indexer.compressor.wkv|wgate", bf16, 2 * s.index_dim, s.hidden, 1, "x2 per ratio-4 layer"},
      {"shared.w1|w3", fp8, s.shared_inter, s.hidden, 1, "x2 per layer"},
      {"shared.w2", fp8, s.hidden, s.shared_inter, 1, ""},
      {"head", bf16, s.vocab_rows, s.hidden, 1, "once per step"},
  };
}

void RunOne(Bench& b, const LinearSpec& spec, int64_t max_t, uint64_t seed) {
  kernels::Backend& be = b.backend;
  const int64_t G = spec.groups, N = G * spec.n, K = G * spec.k;  // y [T, N], x [T, K]
  const std::string base = absl::StrFormat("%s [%d, %d]%s", kernels::WeightFormatName(spec.format), spec.n, spec.k,
                                           G > 1 ? absl::StrFormat(" x %d groups", G) : std::string());
  std::vector<kernels::LinearHandle> copies;
  {
    const HostLinear host = SynthLinear("bench." + spec.op, spec.format, G * spec.n, spec.k, seed);
    absl::StatusOr<kernels::LinearHandle> first = be.PrepareLinear(host.view);
    if (!first.ok()) return b.Fail("linear", spec.op, base, first.status());
    const int sets = b.SetsFor(static_cast<double>((*first)->device_bytes()));
    copies.push_back(*std::move(first));
    for (int i = 1; i < sets; ++i) {
      absl::StatusOr<kernels::LinearHandle> w = be.PrepareLinear(host.view);
      if (!w.ok()) return b.Fail("linear", spec.op, base, w.status());
      copies.push_back(*std::move(w));
    }
  }
  const double weight_bytes = static_cast<double>(copies[0]->device_bytes());
  absl::StatusOr<kernels::Buffer> x = UploadVector(be, RandomFloats(max_t * K, seed + 1));
  absl::StatusOr<kernels::Buffer> y = be.Allocate(max_t * N * 4, kernels::MemoryKind::kWorkspace);
  if (!x.ok() || !y.ok()) return b.Fail("linear", spec.op, base, x.ok() ? y.status() : x.status());
  const float* xp = x->as<const float>();
  float* yp = y->as<float>();

  for (int64_t t : b.sweep.linear_tokens) {
    Case c{.family = "linear",
           .op = spec.op,
           .shape = absl::StrFormat("%s T=%d", base, t),
           .params = {{"format", kernels::WeightFormatName(spec.format)}, {"n", spec.n}, {"k", spec.k},
                      {"groups", G}, {"t", t}},
           .max_sets = static_cast<int>(copies.size()),
           .rotated_bytes_per_set = weight_bytes,
           .note = spec.note};
    c.enqueue = [&be, &copies, xp, yp, t, G](int s) {
      be.ops().Linear({.w = copies[static_cast<size_t>(s)].get(), .x = {.data = xp, .dtype = kernels::DType::kF32},
                       .y = yp, .t = t, .groups = static_cast<int>(G)});
    };
    c.bytes = [weight_bytes, t, N, K](int) { return weight_bytes + 4.0 * t * K + 4.0 * t * N; };
    c.prepare = [&be, yp, t, N] {
      Poison(be, yp, t * N);
      return be.Synchronize();
    };
    c.check = [&be, yp, t, N] { return CheckFinite(be, yp, t * N, "y"); };
    b.Run(be, c);
  }
}

}  // namespace

void RunLinearCases(Bench& b) {
  int64_t max_t = 1;
  for (int64_t t : b.sweep.linear_tokens) max_t = std::max(max_t, t);
  uint64_t seed = b.seed * 1000;
  for (const LinearSpec& spec : Specs(b.shapes)) RunOne(b, spec, max_t, seed += 17);
}

}  // namespace dsv4::bench
