// Shard layout and reading one rank's block of a linear in its checkpoint format: see shard.h.
#include "model/dsv4/shard.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/rank_world.h"
#include "common/status_macros.h"
#include "model/checkpoint/weight_formats.h"

namespace dsv4::model {
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

namespace {

kernels::WeightFormat KernelFormat(ckpt::WeightFormat f) {
  switch (f) {
    case ckpt::WeightFormat::kBF16: return kernels::WeightFormat::kBF16;
    case ckpt::WeightFormat::kF32: return kernels::WeightFormat::kF32;
    case ckpt::WeightFormat::kFp8Block128: return kernels::WeightFormat::kFp8Block128;
    case ckpt::WeightFormat::kNvfp4: return kernels::WeightFormat::kNvfp4;
    case ckpt::WeightFormat::kMxfp4: return kernels::WeightFormat::kMxfp4;
  }
  return kernels::WeightFormat::kF32;
}

// Bytes per element (num / den) and the block of W one scale covers (block_rows 0: no scales).
struct Geometry {
  int64_t bytes_num, bytes_den;
  int64_t block_rows, block_cols;
};

Geometry GeometryOf(ckpt::WeightFormat f) {
  switch (f) {
    case ckpt::WeightFormat::kBF16: return {2, 1, 0, 0};
    case ckpt::WeightFormat::kF32: return {4, 1, 0, 0};
    case ckpt::WeightFormat::kFp8Block128: return {1, 1, ckpt::kFp8BlockSize, ckpt::kFp8BlockSize};
    case ckpt::WeightFormat::kNvfp4: return {1, 2, 1, ckpt::kNvfp4BlockSize};
    case ckpt::WeightFormat::kMxfp4: return {1, 2, 1, ckpt::kMxfp4BlockSize};
  }
  return {4, 1, 0, 0};
}

// Whether [r.begin, r.end()) of an axis of length `total` falls on blocks of `block` (a last partial block is
// fine when the range runs to the end).
bool OnBlocks(Range r, int64_t block, int64_t total) {
  if (block <= 1) return true;
  return r.begin % block == 0 && (r.size % block == 0 || r.end() == total);
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

namespace {

// A linear block on the format's blocks: its data and scale bytes as ranges relative to the start of the weight
// and scale tensors (one range when the block is whole rows, else one per row), and its view without pointers.
struct BlockBytes {
  kernels::WeightView view;
  std::vector<ckpt::ByteRange> data, scale;
  bool dequantise = false;
  ckpt::LinearWeight weight;  // views into the mapping (data untouched)
};

absl::StatusOr<BlockBytes> BlockOf(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n, int64_t k,
                                   Range rows, Range cols) {
  BlockBytes b;
  DSV4_ASSIGN_OR_RETURN(b.weight, LoadChecked(ck, base, n, k));
  const ckpt::LinearWeight& w = b.weight;
  DSV4_RETURN_IF_ERROR(CheckRange(base, "rows", rows, n));
  DSV4_RETURN_IF_ERROR(CheckRange(base, "columns", cols, k));
  b.view = {.name = std::string(base), .format = KernelFormat(w.format), .n = rows.size, .k = cols.size,
            .scale_f32 = false, .global_scale = w.scale_2};
  const Geometry g = GeometryOf(w.format);
  const bool blocked = g.block_rows > 0;
  if (!OnBlocks(rows, blocked ? g.block_rows : 1, n) || !OnBlocks(cols, blocked ? g.block_cols : 1, k) ||
      (g.bytes_den == 2 && cols.begin % 2 != 0)) {
    b.dequantise = true;  // off the format's blocks: this block alone cannot keep the checkpoint format
    return b;
  }
  // Bytes of one row of data, and of the block's part of a row.
  const int64_t row_bytes = k * g.bytes_num / g.bytes_den;
  const int64_t col0 = cols.begin * g.bytes_num / g.bytes_den;
  const int64_t col_bytes = cols.size * g.bytes_num / g.bytes_den;
  const int64_t scale_cols = blocked ? CeilDiv(k, g.block_cols) : 0;
  const int64_t s_row0 = blocked ? rows.begin / g.block_rows : 0;
  const int64_t s_rows = blocked ? CeilDiv(rows.size, g.block_rows) : 0;
  const int64_t s_col0 = blocked ? cols.begin / g.block_cols : 0;
  const int64_t s_cols = blocked ? CeilDiv(cols.size, g.block_cols) : 0;
  auto range = [](int64_t offset, int64_t bytes) {
    return ckpt::ByteRange{static_cast<uint64_t>(offset), static_cast<uint64_t>(bytes)};
  };
  if (cols.begin == 0 && cols.size == k) {  // whole rows: contiguous
    b.data.push_back(range(rows.begin * row_bytes, rows.size * row_bytes));
    if (blocked) b.scale.push_back(range(s_row0 * scale_cols, s_rows * scale_cols));
    return b;
  }
  for (int64_t r = 0; r < rows.size; ++r) b.data.push_back(range((rows.begin + r) * row_bytes + col0, col_bytes));
  for (int64_t r = 0; r < s_rows; ++r) b.scale.push_back(range((s_row0 + r) * scale_cols + s_col0, s_cols));
  return b;
}

// Packs `ranges` of the mapped tensor `t` one after another.
std::vector<uint8_t> Pack(const ckpt::TensorView& t, const std::vector<ckpt::ByteRange>& ranges) {
  size_t bytes = 0;
  for (const ckpt::ByteRange& r : ranges) bytes += r.bytes;
  std::vector<uint8_t> out(bytes);
  size_t at = 0;
  for (const ckpt::ByteRange& r : ranges) {
    std::memcpy(out.data() + at, t.data + r.offset, r.bytes);
    at += r.bytes;
  }
  return out;
}

}  // namespace

absl::StatusOr<HostLinear> ReadLinearBlock(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n, int64_t k,
                                           Range rows, Range cols) {
  DSV4_ASSIGN_OR_RETURN(BlockBytes b, BlockOf(ck, base, n, k, rows, cols));
  const ckpt::LinearWeight& w = b.weight;
  HostLinear h;
  h.view = b.view;
  if (b.dequantise) {
    std::vector<float> f(static_cast<size_t>(rows.size * cols.size));
    DSV4_RETURN_IF_ERROR(ckpt::DequantizeBlock(w, rows.begin, rows.size, cols.begin, cols.size, f));
    h.owned_data.resize(f.size() * 4);
    std::memcpy(h.owned_data.data(), f.data(), h.owned_data.size());
    h.view.format = kernels::WeightFormat::kF32;
    h.view.global_scale = 1.f;
    h.view.data = h.owned_data.data();
    return h;
  }
  // One range: point into the mapped file; several (a column slice): copy them out.
  if (b.data.size() == 1) {
    h.view.data = w.weight.data + b.data[0].offset;
  } else {
    h.owned_data = Pack(w.weight, b.data);
    h.view.data = h.owned_data.data();
  }
  if (b.scale.size() == 1) {
    h.view.scale = w.scale.data + b.scale[0].offset;
  } else if (!b.scale.empty()) {
    h.owned_scale = Pack(w.scale, b.scale);
    h.view.scale = h.owned_scale.data();
  }
  return h;
}

absl::StatusOr<LinearBlockPlan> PlanLinearBlock(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n,
                                                int64_t k, Range rows, Range cols) {
  DSV4_ASSIGN_OR_RETURN(BlockBytes b, BlockOf(ck, base, n, k, rows, cols));
  LinearBlockPlan p;
  p.view = b.view;
  p.dequantise = b.dequantise;
  if (b.dequantise) return p;
  auto item = [&](const std::string& tensor, const std::vector<ckpt::ByteRange>& ranges,
                  ckpt::StreamItem* out) -> absl::Status {
    DSV4_ASSIGN_OR_RETURN(ckpt::TensorLocation at, ck.Locate(tensor));
    out->name = tensor;
    out->path = at.path;
    for (const ckpt::ByteRange& r : ranges) out->ranges.push_back({at.offset + r.offset, r.bytes});
    return absl::OkStatus();
  };
  DSV4_RETURN_IF_ERROR(item(b.weight.weight.name, b.data, &p.data));
  if (!b.scale.empty()) DSV4_RETURN_IF_ERROR(item(b.weight.scale.name, b.scale, &p.scale));
  return p;
}

absl::StatusOr<HostLinear> ReadLinear(const ckpt::Checkpoint& ck, absl::string_view base, int64_t n, int64_t k) {
  return ReadLinearBlock(ck, base, n, k, Range{0, n}, Range{0, k});
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

}  // namespace dsv4::model
