// dsv4-decode-bench's weights: a ckpt::Checkpoint held in memory (Checkpoint::InMemory) with every tensor the
// model loader reads for a Config, in the checkpoint formats (FP8 block-128, NVFP4 / MXFP4 experts, BF16, F32),
// so the model loads through its own loader and the backend's own PrepareLinear / PrepareExperts, exactly as from
// a folder, but with no checkpoint on disk and no pass over hundreds of GB on the host.
//
// How it stays fast (seconds for 43 flash layers): bytes are generated once and shared. Every FP8 linear is a
// window of one pool of random e4m3 codes (NaN codes removed) at a per-tensor offset, with a constant ue8m0 block
// scale chosen for the magnitude tools/make_checkpoint gives that kind of parameter (activations stay O(1));
// every routed expert is a window of one pool of random e2m1 nibbles (every nibble is a valid code) with scales
// from a pool of positive finite e4m3 (NVFP4) or ue8m0 (MXFP4) bytes; BF16 linears (embedding, head, router,
// compressor and indexer projections) and plain tensors are generated per distinct name-without-layer and shape,
// so layers share them. The weights differ per tensor (different windows) but not per layer for the BF16 ones:
// timing depends on bytes, not values. Routing (gate.bias, tid2eid) follows the RoutingSpec (routing.h).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "bench/decode/routing.h"
#include "model/checkpoint/checkpoint.h"
#include "model/config/config.h"
#include "model/config/tensor_inventory.h"

namespace dsv4::bench {

struct SyntheticWeights {
  std::unique_ptr<ckpt::Checkpoint> checkpoint;
  int64_t host_bytes = 0;     // host memory the tensors' bytes take (shared bytes counted once)
  int64_t tensors = 0;
  double hot_bias = 0;        // the skewed routing's calibrated gate.bias (0 for random)
};

// Every tensor of the main layers of `config` (MTP layers are not read by decode) plus the globals.
absl::StatusOr<SyntheticWeights> MakeSyntheticWeights(const Config& config, ExpertFormat experts,
                                                      const RoutingSpec& routing, uint64_t seed);

}  // namespace dsv4::bench
