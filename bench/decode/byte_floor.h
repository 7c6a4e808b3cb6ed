// The byte floor of a decode step (GPU-ENGINE.md §5): the bytes a step cannot avoid reading, once each - every
// weight byte it touches in its checkpoint format (the dense weights of every layer and the head; of the routed
// experts only those the step's routing picked; of the embedding only the B rows looked up) plus the KV rows it
// attends (window rows, the top-k compressed rows of ratio-4 layers, all compressed rows of ratio-128 layers) and
// the indexer rows it scores (all of them) - over the copy bandwidth measured in the same run. Counted from the
// config (tensor_inventory.h), not from what a backend happens to hold, so the CPU and CUDA runs count alike;
// a rank of a T-way group counts its shard (docs/tensor-parallel.md: heads, output groups, shared-expert slice,
// vocabulary rows and E/T experts; the KV is replicated).
#pragma once

#include <cstdint>

#include "model/config/config.h"
#include "model/config/tensor_inventory.h"

namespace dsv4::bench {

struct WeightBytes {
  int64_t dense = 0;        // every non-expert weight a step reads (all layers, final norm, mHC head, head)
  int64_t per_expert = 0;   // one routed expert's w1 + w3 + w2 with scales
  int64_t experts_held = 0; // per layer
  int64_t embed_row = 0;    // one embedding row
  int64_t resident = 0;     // everything the rank holds (dense + all held experts + embedding + tid2eid)
};
WeightBytes CountWeightBytes(const Config& config, ExpertFormat experts, int world);

struct KvBytes {
  int64_t attention = 0;  // KV rows attended, per sequence
  int64_t indexer = 0;    // indexer rows scored, per sequence
};
// One sequence at `context` positions in production mode (584-byte rows; fp32 indexer rows).
KvBytes CountKvBytes(const Config& config, int64_t context);

}  // namespace dsv4::bench
