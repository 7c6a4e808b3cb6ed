// The DeepSeek-V4 weights of one rank, prepared by the backend at load (kernels/backend.h): linears as
// handles in whatever layout the backend chose (the CPU reference dequantises to fp32; CUDA keeps the
// checkpoint formats on the device), plain tensors (norms, mHC parameters, sinks, ape, router bias) as fp32 in
// backend memory. Names are the official checkpoint's (dsv4-decode.md §4.1); every tensor's shape is checked
// against the Config and errors name the tensor. Sharding is applied here (model/dsv4/shard.h), never in the
// forward: with a world > 1 only this rank's block of each sharded tensor is read.
//
// Where the bytes come from (WeightLoadOptions::mode): mapped - views into the mmap'd checkpoint handed straight to
// the backend (the CPU backend dequantises from the page cache with no extra copy); streamed - the default on a
// device backend: the loader first walks the model once reading headers only (the plan: every byte range of this
// rank, in the order the loader will use them), then reader threads pread those ranges into a ring of pinned host
// staging (model/checkpoint/stream_reader.h) while the backend copies and prepares the tensors before them, so
// reads overlap copies, page-cache and disk reads go at pread speed, and the copies run from pinned memory. Both
// hand the backend the same bytes (tests/model/weight_stream_test.cc, tests/cuda/weight_stream_cuda_test.cc).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/checkpoint/checkpoint.h"
#include "model/config/config.h"
#include "model/dsv4/shard.h"

namespace dsv4::model {

// A plain fp32 tensor in backend memory.
struct PlainTensor {
  std::vector<int64_t> shape;
  kernels::Buffer buffer;
  const float* ptr() const { return buffer.as<const float>(); }
};

// A softmax-pooling compressor (main: d = head_dim; indexer: d = index_head_dim). c = 2 when ratio 4.
struct CompressorWeights {
  kernels::LinearHandle wkv;    // [c*d, D]
  kernels::LinearHandle wgate;  // [c*d, D]
  PlainTensor ape;              // [ratio, c*d]
  PlainTensor norm;             // [d]
};

struct LayerWeights {
  int ratio = 0;
  bool hash = false;
  PlainTensor attn_norm, ffn_norm;                       // [D]
  PlainTensor hc_attn_fn, hc_attn_base, hc_attn_scale;   // [(2+S)S, S*D], [(2+S)S], [3]
  PlainTensor hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  kernels::LinearHandle wq_a;   // [q_lora, D]
  PlainTensor q_norm;           // [q_lora]
  kernels::LinearHandle wq_b;   // [H*Dh, q_lora] (this rank's heads)
  kernels::LinearHandle wkv;    // [Dh, D]
  PlainTensor kv_norm;          // [Dh]
  kernels::LinearHandle wo_a;   // [G*o_lora, H*Dh/G] (this rank's groups)
  kernels::LinearHandle wo_b;   // [D, G*o_lora]
  PlainTensor attn_sink;        // [H]
  CompressorWeights compressor;            // ratio > 0
  kernels::LinearHandle idx_wq_b;          // ratio 4: [IH*ID, q_lora]
  kernels::LinearHandle idx_weights_proj;  // ratio 4: [IH, D]
  CompressorWeights idx_compressor;        // ratio 4
  kernels::LinearHandle gate;              // [E, D]
  PlainTensor gate_bias;                   // [E] (non-hash layers)
  kernels::Buffer tid2eid;                 // int32 [V, Ek] (hash layers)
  kernels::ExpertsHandle experts;          // E x (w1, w3 [I, D], w2 [D, I]); this rank's held
  kernels::LinearHandle shared_w1, shared_w3, shared_w2;  // [Is, D], [Is, D], [D, Is] (this rank's slice)
};

struct ModelWeights {
  kernels::LinearHandle embed;  // [V, D]
  kernels::LinearHandle head;   // [V, D] (this rank's vocabulary rows)
  PlainTensor norm;             // [D]
  PlainTensor hc_head_fn, hc_head_base, hc_head_scale;  // [S, S*D], [S], [1]
  std::vector<LayerWeights> layers;  // main layers only (MTP is not used by decode)
};

struct WeightLoadOptions {
  enum class Mode { kAuto, kMapped, kStreamed };
  // kAuto: streamed on a backend with a device (device_control()) from a checkpoint on disk when this rank reads at
  // least auto_stream_min_bytes, mapped otherwise (kStreamed refuses an in-memory checkpoint). ShouldStream decides.
  Mode mode = Mode::kAuto;
  // Below this many bytes per rank mapping is as fast or faster: pinning the staging ring costs ~0.3 s, and the H200
  // machine measured 5.7 GB/s mapped vs 4.3 streamed on 2 GB warm, 3.8 vs 6.0 on 6.6 GB (bench/RESULTS.md, load).
  int64_t auto_stream_min_bytes = int64_t{3'000'000'000};
  int reader_threads = 4;
  int64_t chunk_bytes = int64_t{16} << 20;  // largest single pread
  // Staging = the largest set of bytes the loader holds at once (one layer's routed experts, or the embedding)
  // plus the largest tensor plus this much read-ahead. Pinning costs time (~0.45 ms per MiB on the H200 machine,
  // zero-fill included), and the reads outrun the backend's copies, so a little read-ahead is enough.
  int64_t read_ahead_bytes = int64_t{64} << 20;
};

// "auto", "mapped", "streamed" -> Mode (the worker's --weight-load); InvalidArgument naming the choices otherwise.
absl::StatusOr<WeightLoadOptions::Mode> ParseWeightLoadMode(std::string_view name);

// Whether LoadWeights streams, and why (for the start-up log): kStreamed yes, kMapped no, kAuto when the backend has
// a device, the checkpoint is on disk and this rank reads at least auto_stream_min_bytes (`rank_bytes`: the plan's
// total; only asked once there is a plan).
struct LoadChoice {
  bool streamed = false;
  std::string why;
};
LoadChoice ShouldStream(const WeightLoadOptions& options, bool has_device, bool in_memory, int64_t rank_bytes);

// What a load cost, for the start-up log ("weights: streamed 1.93 GB in ...") and the load benchmark.
struct WeightLoadStats {
  bool streamed = false;
  std::string choice;            // why this path (ShouldStream), e.g. "auto: 1.93 GB below 3.00 GB"
  int64_t bytes = 0;             // checkpoint bytes this rank read (handed to the backend)
  double seconds = 0;            // the whole LoadWeights
  double plan_seconds = 0;       // streamed: the header-only walk
  double staging_seconds = 0;    // streamed: allocating (pinning) the staging ring
  int64_t staging_bytes = 0;
  double read_seconds = 0;       // streamed: wall time with a pread in flight
  double wait_seconds = 0;       // streamed: time the loader waited for reads
  double prepare_seconds = 0;    // time in the backend: copies to the device, scale conversion, expert repack
  int threads = 0;
  std::string ToString() const;
};

// With a shard layout (world > 1) only this rank's part is read and kept: wq_b rows and attn_sink entries of its
// heads, its block of wo_a and columns of wo_b, its routed experts (the others are not held), its slice of the
// shared expert, its vocabulary rows of head. on_layer (may be empty) is called after each main layer with
// (layers loaded, main layers).
absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const ckpt::Checkpoint& ckpt, const Config& config,
                                                          kernels::Backend& backend, const ShardLayout* shard,
                                                          const std::function<void(int, int)>& on_layer = {},
                                                          const WeightLoadOptions& options = {},
                                                          WeightLoadStats* stats = nullptr);

}  // namespace dsv4::model
