// The DeepSeek-V4 forward pass on the ops interface: the one API the worker engine calls.
//
// Contract with worker/ (written first so the engine can code against it):
//  - The KV cache is paged, vLLM-style. There are four pools (KvPool, step.h). Each sequence has one block table
//    per pool, shared by every layer that uses that pool: page id g names the same slot in every layer's pool.
//  - The window pool is a ring of config.sliding_window rows per sequence: position p lives in ring row
//    p mod window, i.e. page tables.pages[kWindow][(p mod window) / page_rows], row (p mod window) % page_rows.
//    A sequence needs ceil(window / page_rows) window pages from its first token (RowsNeeded says window).
//  - Compressed pools hold one row per r tokens (row n = positions n*r .. n*r+r-1); the indexer pool has one
//    128-dim row per ratio-4 compressed row. Row n is page tables.pages[pool][n / page_rows], row n % page_rows.
//  - Compressor/indexer running state lives in a per-sequence state slot (tables.state_slot), reset by ResetState
//    before a sequence's first token.
//  - Forward takes any mix of chunks (a prefill chunk of many tokens or one decode token), each at its own
//    position; prefill in chunks leaves exactly the state that one-token-at-a-time decoding would.
//  - The compute runs on the Backend given in ModelOptions (kernels/backend.h); the model constructs none. Weights,
//    KV pools and the step workspace are backend memory, planned at Load / AllocateCache: a step allocates
//    nothing and copies its plan to the backend once (one packed int32 buffer) and the logits back once.
//  - A step is three calls (Forward makes them for you): PrepareStep packs the plan padded to a StepShape and
//    copies it in; EnqueueStep enqueues the layers and the head, reading everything that varies from step to step
//    from that plan in backend memory, so a CUDA graph captured of it replays any later plan of the same shape
//    (worker/graph_runner.h); FinishStep copies the logits out and waits.
// Threading: a Dsv4Model is used by one thread at a time (the engine thread).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/config/config.h"
#include "model/dsv4/hooks.h"
#include "model/dsv4/shard.h"
#include "model/dsv4/step.h"
#include "model/dsv4/weights.h"

namespace dsv4::ckpt {
class Checkpoint;
}

namespace dsv4::model {

// kExact: fp32 everywhere, no quantisation simulation: what transformers' DeepseekV4ForCausalLM computes in fp32.
// kProduction: window/compressed KV nope dims stored as FP8 e4m3 + ue8m0 per 64 dims in the 584-byte row, and
// the indexer's Hadamard + FP4 simulation, as DeepSeek's reference inference code does.
enum class NumericMode { kExact, kProduction };

// The size a step is padded to, and every host value its ops are given (T, B, the longest chunk, the head rows): a
// graph captured for one shape replays any plan packed to it. Padding tokens have pos -1 and padding sequences
// seq_len 0 and state slot -1; every op skips them (kernels/ops.h).
struct StepShape {
  int64_t tokens = 0;   // T: the chunks' tokens in order, then padding tokens
  int64_t seqs = 0;     // B: the chunks, then padding sequences; also the logit rows (each chunk's last token)
  int max_seq_len = 1;  // the longest chunk may have this many tokens (1: a decode-only step)
  // The decode bucket of b sequences of one token each.
  static StepShape Decode(int64_t b) { return {.tokens = b, .seqs = b, .max_seq_len = 1}; }
  bool operator==(const StepShape&) const = default;
};

struct ModelOptions {
  NumericMode mode = NumericMode::kExact;
  // The compute backend (required); it must outlive the model.
  kernels::Backend* backend = nullptr;
  // Tensor parallelism (docs/tensor-parallel.md): which shard to load, and the group's collectives (required when
  // shard.world > 1). The forward all-reduces after attention and after the MoE and gathers the logits;
  // config() stays the full model's.
  ShardSpec shard = {};
  Collectives* collectives = nullptr;
  // Decode time by phase (hooks.h); null = no timing and no cost. Must outlive its use; same thread as Forward.
  PhaseHook* phase_hook = nullptr;
  // The largest step the caller will run (tokens over all chunks) and the longest sequence (positions): the step
  // workspace and block-table arrays are planned for them at AllocateCache; larger steps are refused.
  int64_t max_step_tokens = 2048;
  int64_t max_context = 8192;
  // The projections that read the same input as one FusedLinear op each (ops.h): wq_a, wkv and the compressor and
  // indexer projections of the normed hidden state; wq_b and the indexer's wq_b of c_q. On by default: on the H200
  // the TP 4 decode step is 10% shorter at B = 1 and 9% at B = 64 (bench/RESULTS.md); off: one Linear each (results
  // agree within the linear's tolerance, bit for bit on the CPU backend).
  bool fuse_projections = true;
  // Called by Load after each main layer's weights are in memory (progress lines on long loads); may be empty.
  std::function<void(int layers_loaded, int layers_total)> on_layer_loaded = nullptr;
  // Mapped or streamed weight loading (weights.h; the worker's --weight-load).
  WeightLoadOptions weight_load = {};
};

class Dsv4Model {
 public:
  static absl::StatusOr<std::unique_ptr<Dsv4Model>> Load(const std::string& checkpoint_dir,
                                                         const ModelOptions& options);
  // The same from an open checkpoint and its config (e.g. ckpt::Checkpoint::InMemory: bench/decode's synthetic
  // weights). `checkpoint` is read during the call only.
  static absl::StatusOr<std::unique_ptr<Dsv4Model>> Load(const ckpt::Checkpoint& checkpoint, const Config& config,
                                                         const ModelOptions& options);
  ~Dsv4Model();

  const Config& config() const;
  const ModelOptions& options() const;

  // Bytes of one page of page_rows rows, summed over all layers that use the pool.
  int64_t PageBytes(KvPool pool, int page_rows) const;
  // Rows of the pool a sequence of num_positions tokens uses (window: always sliding_window once it has a token).
  static int64_t RowsNeeded(const Config& config, KvPool pool, int64_t num_positions);

  // Allocates every pool (pages_per_pool[pool] pages of page_rows rows), max_state_slots state slots and the
  // step workspace (steps of up to max_state_slots chunks and ModelOptions::max_step_tokens tokens), and sizes the
  // backend's op scratch. May be called again to resize; all cached data is dropped.
  absl::Status AllocateCache(std::array<int64_t, kNumKvPools> pages_per_pool, int page_rows, int max_state_slots);
  // Fresh compressor/indexer state for a new sequence in this slot.
  absl::Status ResetState(int32_t state_slot);

  // Appends each chunk's tokens and writes the logits of each chunk's LAST token to logits[i * vocab_size].
  // Pages for every position written must already be in the tables.
  absl::Status Forward(std::span<const SeqChunk> chunks, float* logits);
  // Same, but returns the logits of every token of every chunk, chunk-major ([sum of tokens, vocab_size]).
  absl::Status ForwardAllLogits(std::span<const SeqChunk> chunks, std::vector<float>* logits);

  // The step in three calls (Forward = PrepareStep(chunks, ShapeOf(chunks)) + EnqueueStep + FinishStep):
  //  PrepareStep: validates the chunks and that they fit `shape` and the workspace (no chunks at all is an
  //    all-padding step, e.g. a warm-up), packs the plan padded to `shape` into host staging, copies it to the
  //    backend (the one copy in) and advances each chunk's state slot position. Host work only besides the copy.
  //  EnqueueStep: enqueues every layer and the head for a plan of `shape` (logit rows: one per sequence, the
  //    padding ones included). No host sync, no allocation, no copy: capturable into a CUDA graph, and replaying
  //    that graph after a later PrepareStep to the same shape runs that step. Fails only on a shape the workspace
  //    cannot hold (before enqueuing anything).
  //  FinishStep: copies the first `rows` logit rows ([rows, vocab_size], the chunks' in order) to the host (the
  //    one copy out), waits for the backend and returns the step's first error (a launch, a collective).
  // Sampling on the backend (kernels/ops.h Sample): PrepareStep packs `sampling[i]` for chunk i (rows past it,
  // and padding rows, draw nothing: token -1), EnqueueStep(shape, true) ends with the Sample op over the logit
  // rows, and FinishStepTokens copies the `rows` drawn token ids out instead of the logits.
  static StepShape ShapeOf(std::span<const SeqChunk> chunks);
  absl::Status PrepareStep(std::span<const SeqChunk> chunks, const StepShape& shape,
                           std::span<const kernels::SampleParams> sampling = {});
  absl::Status EnqueueStep(const StepShape& shape, bool sample = false);
  absl::Status FinishStep(float* logits, int64_t rows);
  absl::Status FinishStepTokens(int32_t* tokens, int64_t rows);
  // After FinishStepTokens: the raw logits of logit rows `rows` of that step ([rows.size(), vocab_size]; the
  // Sample op reads the logits without changing them), copied to the host and waited for.
  absl::Status CopyLogitRows(std::span<const int> rows, float* out);
  // The planned step capacity (AllocateCache): tokens and sequences of the largest StepShape.
  int64_t max_step_tokens() const;
  int64_t max_step_seqs() const;
  // Logit rows one head pass produces at most (the rows GatherVocab is called with are never more).
  int64_t max_head_rows() const;

  // Decode time by phase (hooks.h): replaces ModelOptions::phase_hook (null = none). The forward marks
  // attention, MoE, dense (projections, norms, head) and comm (collectives); the caller owns step boundaries.
  void SetPhaseHook(PhaseHook* hook);

  // Benchmarks only (bench/decode fills the cache with synthetic rows instead of prefilling B x N tokens):
  // the backend memory of every pool and of the compressor state (after AllocateCache), and a state slot marked
  // as having consumed `positions` tokens, as if they had been written (its next chunk starts there).
  struct CacheMemory {
    std::array<void*, kNumKvPools> pool{};          // every layer's slice of the pool, back to back
    std::array<int64_t, kNumKvPools> pool_bytes{};
    std::array<bool, kNumKvPools> fp8_rows{};       // the 584-byte FP8 record (else fp32 rows of the pool's dim)
    float* state = nullptr;                         // every slot's compressor state (fp32)
    int64_t state_floats = 0;
  };
  CacheMemory CacheMemoryForBench() const;
  absl::Status SetSlotPositionForBench(int32_t state_slot, int64_t positions);

  struct Impl;  // opaque; model/dsv4/forward.h defines it for the sublayer files

 private:
  explicit Dsv4Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dsv4::model
