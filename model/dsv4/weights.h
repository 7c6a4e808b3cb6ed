// The DeepSeek-V4 weights as dense fp32 arrays, dequantised once at load (the CPU reference computes in fp32;
// a GPU backend keeps the checkpoint formats). Names are the official checkpoint's (dsv4-decode.md §4.1);
// every tensor's shape is checked against the Config and errors name the tensor.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint/checkpoint.h"
#include "model/config/config.h"

namespace dsv4::comm {
struct ShardLayout;
}

namespace dsv4::model {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
  const float* ptr() const { return data.data(); }
};

// A softmax-pooling compressor (main: d = head_dim; indexer: d = index_head_dim). c = 2 when ratio 4.
struct CompressorWeights {
  Tensor wkv;   // [c*d, D]
  Tensor wgate; // [c*d, D]
  Tensor ape;   // [ratio, c*d]
  Tensor norm;  // [d]
};

struct LayerWeights {
  int ratio = 0;
  bool hash = false;
  Tensor attn_norm, ffn_norm;  // [D]
  Tensor hc_attn_fn, hc_attn_base, hc_attn_scale;  // [(2+S)S, S*D], [(2+S)S], [3]
  Tensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  Tensor wq_a;       // [q_lora, D]
  Tensor q_norm;     // [q_lora]
  Tensor wq_b;       // [H*Dh, q_lora]
  Tensor wkv;        // [Dh, D]
  Tensor kv_norm;    // [Dh]
  Tensor wo_a;       // [G*o_lora, H*Dh/G]
  Tensor wo_b;       // [D, G*o_lora]
  Tensor attn_sink;  // [H]
  CompressorWeights compressor;      // ratio > 0
  Tensor idx_wq_b;                   // ratio 4: [IH*ID, q_lora]
  Tensor idx_weights_proj;           // ratio 4: [IH, D]
  CompressorWeights idx_compressor;  // ratio 4
  Tensor gate;                       // [E, D]
  Tensor gate_bias;                  // [E] (non-hash layers)
  std::vector<int32_t> tid2eid;      // [vocab, K] (hash layers)
  std::vector<Tensor> w1, w3, w2;    // E x [I, D], [I, D], [D, I]
  Tensor shared_w1, shared_w3, shared_w2;
};

struct ModelWeights {
  Tensor embed;  // [V, D]
  Tensor head;   // [V, D]
  Tensor norm;   // [D]
  Tensor hc_head_fn, hc_head_base, hc_head_scale;  // [S, S*D], [S], [1]
  std::vector<LayerWeights> layers;  // main layers only (MTP is not used by decode)
};

// With a shard (tensor parallelism, comm/shard.h) only this rank's part is read and kept: wq_b rows and attn_sink
// entries of its heads, its block of wo_a and columns of wo_b, its routed experts (the others stay empty), its
// slice of the shared expert, its vocabulary rows of head. Shapes are then the local ones. on_layer (may be
// empty) is called after each main layer with (layers loaded, main layers).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const ckpt::Checkpoint& ckpt, const Config& config,
                                                          const comm::ShardLayout* shard = nullptr,
                                                          const std::function<void(int, int)>& on_layer = {});

}  // namespace dsv4::model
