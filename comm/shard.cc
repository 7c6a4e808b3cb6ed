// Shard layout, sharded linear loading and the vocabulary gather: see shard.h.
#include "comm/shard.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/checkpoint/weight_formats.h"

namespace dsv4::comm {
namespace {

// The rank's equal share of `total`, refusing a world that does not divide it.
absl::StatusOr<Range> EvenShare(const char* field, int64_t total, ShardSpec spec) {
  if (total % spec.world != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " ", total, " is not divisible by world ", spec.world, ": cannot split it evenly"));
  }
  const int64_t per = total / spec.world;
  return Range{spec.rank * per, per};
}

absl::StatusOr<ckpt::LinearWeight> LoadChecked(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n,
                                               int64_t k) {
  DSV4_ASSIGN_OR_RETURN(ckpt::LinearWeight w, ckpt::LoadLinearWeight(ck, base));
  if (w.n != n || w.k != k) {
    return absl::InvalidArgumentError(
        absl::StrCat(base, ": expected a [", n, ",", k, "] linear, found [", w.n, ",", w.k, "]"));
  }
  return w;
}

absl::Status CheckRange(absl::string_view base, const char* what, Range r, int64_t limit) {
  if (r.begin < 0 || r.size < 0 || r.end() > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(base, ": ", what, " [", r.begin, ", ", r.end(), ") outside [0, ", limit, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardLayout> PlanShardLayout(const Config& c, ShardSpec spec) {
  DSV4_RETURN_IF_ERROR(ValidateRankWorld(spec.rank, spec.world));
  ShardLayout l;
  l.spec = spec;
  DSV4_ASSIGN_OR_RETURN(l.heads, EvenShare("num_attention_heads", c.num_attention_heads, spec));
  DSV4_ASSIGN_OR_RETURN(l.experts, EvenShare("n_routed_experts", c.n_routed_experts, spec));
  DSV4_ASSIGN_OR_RETURN(l.shared_inter,
                        EvenShare("shared expert width (moe_intermediate_size * n_shared_experts)",
                                  c.moe_intermediate_size * c.n_shared_experts, spec));
  if (c.o_groups < 1 || c.num_attention_heads % c.o_groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_attention_heads ", c.num_attention_heads,
                                                   " is not divisible by o_groups ", c.o_groups));
  }
  const int64_t group_in = c.num_attention_heads / c.o_groups * c.head_dim;  // wo_a columns per group
  if (c.o_groups % spec.world == 0) {
    DSV4_ASSIGN_OR_RETURN(l.groups, EvenShare("o_groups", c.o_groups, spec));
    l.group_cols = Range{0, group_in};
  } else if (spec.world % c.o_groups == 0) {
    // Several ranks share one group; each holds the wo_a columns of its own heads.
    const int64_t heads_per_group = c.num_attention_heads / c.o_groups;
    const int64_t g = l.heads.begin / heads_per_group;
    l.groups = Range{g, 1};
    l.group_cols = Range{(l.heads.begin - g * heads_per_group) * c.head_dim, l.heads.size * c.head_dim};
  } else {
    return absl::InvalidArgumentError(absl::StrCat("o_groups ", c.o_groups, " and world ", spec.world,
                                                   ": one must divide the other to split the output projection"));
  }
  if (c.vocab_size < spec.world) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size ", c.vocab_size, " < world ", spec.world));
  }
  l.vocab_slot = (c.vocab_size + spec.world - 1) / spec.world;
  const int64_t begin = std::min<int64_t>(c.vocab_size, spec.rank * l.vocab_slot);
  l.vocab = Range{begin, std::min<int64_t>(c.vocab_size, begin + l.vocab_slot) - begin};
  return l;
}

absl::StatusOr<std::vector<float>> LoadLinearBlock(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n,
                                                   int64_t k, Range rows, Range cols) {
  DSV4_ASSIGN_OR_RETURN(ckpt::LinearWeight w, LoadChecked(ck, base, n, k));
  DSV4_RETURN_IF_ERROR(CheckRange(base, "rows", rows, n));
  DSV4_RETURN_IF_ERROR(CheckRange(base, "columns", cols, k));
  std::vector<float> out(static_cast<size_t>(rows.size * cols.size));
  DSV4_RETURN_IF_ERROR(ckpt::DequantizeBlock(w, rows.begin, rows.size, cols.begin, cols.size, out));
  return out;
}

absl::StatusOr<std::vector<float>> LoadLinearRows(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n,
                                                  int64_t k, Range rows) {
  DSV4_ASSIGN_OR_RETURN(ckpt::LinearWeight w, LoadChecked(ck, base, n, k));
  DSV4_RETURN_IF_ERROR(CheckRange(base, "rows", rows, n));
  std::vector<float> out(static_cast<size_t>(rows.size * k));
  DSV4_RETURN_IF_ERROR(ckpt::DequantizeRows(w, rows.begin, rows.size, out.data()));
  return out;
}

absl::StatusOr<std::vector<float>> LoadLinearCols(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n,
                                                  int64_t k, Range cols) {
  DSV4_ASSIGN_OR_RETURN(ckpt::LinearWeight w, LoadChecked(ck, base, n, k));
  DSV4_RETURN_IF_ERROR(CheckRange(base, "columns", cols, k));
  std::vector<float> out(static_cast<size_t>(n * cols.size));
  DSV4_RETURN_IF_ERROR(ckpt::DequantizeBlock(w, 0, n, cols.begin, cols.size, out));
  return out;
}

absl::Status GatherVocabLogits(Communicator& comm, const ShardLayout& layout, const float* local, int64_t rows,
                               int64_t vocab_size, float* full) {
  const int64_t slot = layout.vocab_slot, T = comm.world();
  if (layout.spec.world != T || layout.spec.rank != comm.rank()) {
    return absl::InvalidArgumentError("GatherVocabLogits: layout is for another rank or world");
  }
  if (slot * T < vocab_size) return absl::InvalidArgumentError("GatherVocabLogits: layout does not cover vocab_size");
  // Padded send block [rows, slot] so every rank contributes the same number of bytes.
  std::vector<float> send(static_cast<size_t>(rows * slot), 0.0f), recv(static_cast<size_t>(T * rows * slot));
  for (int64_t r = 0; r < rows; ++r) {
    std::copy_n(local + r * layout.vocab.size, layout.vocab.size, send.data() + r * slot);
  }
  DSV4_RETURN_IF_ERROR(comm.AllGather(send.data(), recv.data(), send.size() * sizeof(float)));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t begin = t * slot, width = std::max<int64_t>(0, std::min(vocab_size, begin + slot) - begin);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy_n(recv.data() + (t * rows + r) * slot, width, full + r * vocab_size + begin);
    }
  }
  return absl::OkStatus();
}

int64_t ResidentBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream in(line.substr(6));
      int64_t kb = -1;
      in >> kb;
      return kb < 0 ? -1 : kb * 1024;
    }
  }
  return -1;
}

}  // namespace dsv4::comm
