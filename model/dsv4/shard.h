// Tensor-parallel sharding of DeepSeek-V4 weights, applied when weights load (docs/tensor-parallel.md).
//
// Which rank holds what (T = world, r = rank; all splits contiguous and equal):
//   attention heads    H/T heads [r·H/T, (r+1)·H/T): rows heads·Dh of wq_b, entries of attn_sink
//   output groups      T <= G: G/T whole groups: rows groups·o_lora of wo_a, columns groups·o_lora of wo_b.
//                      T > G: the one group holding the rank's heads: its o_lora rows of wo_a restricted to the
//                      columns of the rank's heads (a partial z_g), and that group's o_lora columns of wo_b.
//                      Either way y = W_ob z is linear in every head's output, so the ranks' partial y sum to y:
//                      all-reduce after attention. Needs T | G or G | T (powers of two always are).
//   routed experts     E/T experts [r·E/T, ...) (expert parallel inside the group); the router is replicated so
//                      every rank picks the same experts and computes the local ones -> partial y
//   shared expert      I/T intermediate dims: rows of w1/w3, columns of w2 -> partial y; one all-reduce after the
//                      MoE sums routed and shared partials together
//   LM head            vocabulary rows [r·Vp, min(V, (r+1)·Vp)), Vp = ceil(V/T); logits all-gathered
//   replicated         embed, norms, mHC, wq_a, wkv (the latent KV is shared by all heads, MQA), compressor,
//                      indexer (its top-k must see all index heads' scores), router, KV caches
// Model code stays unaware: the loader (weights.cc) reads the rank's weights with ReadLinearBlock and the Config
// seen by the forward carries the local head and group counts; only the two all-reduces and the logits gather
// are collective calls (model/dsv4/hooks.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/weights.h"
#include "model/checkpoint/checkpoint.h"
#include "model/checkpoint/stream_reader.h"
#include "model/config/config.h"

namespace dsv4::model {

struct ShardSpec {
  int rank = 0;
  int world = 1;
};

struct Range {
  int64_t begin = 0;
  int64_t size = 0;
  int64_t end() const { return begin + size; }
};

struct ShardLayout {
  ShardSpec spec;
  Range heads;          // of num_attention_heads
  Range groups;         // of o_groups: whole groups (T <= G) or the single group holding this rank's heads (T > G)
  Range group_cols;     // of each held group's wo_a input columns (H/G·Dh): all of them when T <= G
  Range experts;        // of n_routed_experts
  Range shared_inter;   // of moe_intermediate_size * n_shared_experts
  Range vocab;          // of vocab_size (the last rank's may be shorter)
  int64_t vocab_slot = 0;  // ceil(vocab_size / world): each rank's block in the gathered logits
};

// The rank's share of every split dimension. InvalidArgument naming the field when the world does not divide
// num_attention_heads, n_routed_experts or the shared expert width, when neither of world and o_groups divides
// the other, or when vocab_size < world.
absl::StatusOr<ShardLayout> PlanShardLayout(const Config& config, ShardSpec spec);

// A linear weight as host bytes in its checkpoint format (kernels/weights.h's WeightView), all of it or the
// block rows x cols of it. The view points into the mapped checkpoint where the block is contiguous (all of it,
// or whole rows), into `owned_*` where the block had to be copied out (a column slice on block boundaries), and
// to a dequantised F32 copy where the block does not fall on the format's block boundaries.
struct HostLinear {
  kernels::WeightView view;
  std::vector<uint8_t> owned_data, owned_scale;
};
absl::StatusOr<HostLinear> ReadLinearBlock(const ckpt::Checkpoint& ckpt, absl::string_view base, int64_t n, int64_t k,
                                           Range rows, Range cols);
absl::StatusOr<HostLinear> ReadLinear(const ckpt::Checkpoint& ckpt, absl::string_view base, int64_t n, int64_t k);

// The same block as ReadLinearBlock, as file byte ranges for the streamed loader (stream_reader.h): `data` and
// `scale` (no ranges when the format has no scales) are read and packed one after another, which gives exactly
// the bytes ReadLinearBlock's view holds; `view` has everything but the data / scale pointers. A block off the
// format's blocks cannot be read as bytes (it is dequantised): `dequantise` is set, the items are empty and the
// caller reads it with ReadLinearBlock. Header reads only (and the NVFP4 scalar weight_scale_2).
struct LinearBlockPlan {
  kernels::WeightView view;
  ckpt::StreamItem data, scale;
  bool dequantise = false;
};
absl::StatusOr<LinearBlockPlan> PlanLinearBlock(const ckpt::Checkpoint& ckpt, absl::string_view base, int64_t n,
                                                int64_t k, Range rows, Range cols);

// Resident set size of this process in bytes (VmRSS), for the per-rank memory log after loading; -1 if unknown.
int64_t ResidentBytes();

}  // namespace dsv4::model
