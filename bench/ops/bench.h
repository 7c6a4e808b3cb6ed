// What every op family of dsv4-ops-bench shares: the shapes one rank runs (configs/flash.json, with the TP shard
// applied by --tp / --heads / --experts / --shared_inter / --vocab_rows), which sizes each family sweeps, the
// backend, the runner and the report. Each family lives in its own file (*_cases.cc) and runs its cases through
// Bench::Run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/ops/report.h"
#include "bench/ops/runner.h"
#include "kernels/backend.h"

namespace dsv4::bench {

// The shapes of one rank (letters as in kernels/ops.h).
struct Shapes {
  int64_t hidden = 4096;       // D
  int64_t hc = 4;              // S
  int64_t heads = 64;          // H held by this rank
  int64_t head_dim = 512;      // Dh
  int64_t q_lora = 1024;
  int64_t o_lora = 1024;
  int64_t groups = 8;          // G output groups held by this rank
  int64_t group_in = 4096;     // wo_a columns per group ((H / G) * Dh)
  int64_t window = 128;        // W
  int64_t index_heads = 64;    // IH
  int64_t index_dim = 128;     // ID
  int64_t index_topk = 512;    // Ksel
  int64_t experts = 256;       // E (all of the model's)
  int64_t experts_held = 256;  // held by this rank: experts [0, experts_held)
  int64_t topk = 6;            // Ek
  int64_t moe_inter = 2048;    // I
  int64_t shared_inter = 2048;  // Is held by this rank
  int64_t vocab_rows = 129280;  // head rows held by this rank
  int rope_pairs = 32;
  double rope_theta = 10000.0, compress_rope_theta = 160000.0;
  int sinkhorn_iters = 20;
  float eps = 1e-6f, hc_eps = 1e-6f;
  float routed_scale = 1.5f, swiglu_limit = 10.f;
  int page_rows = 64;           // P of every pool
  int64_t max_context = 131072;  // the planned bound (Reserve, indexer max_rows, ratio-128 max_compressed)
};

// Which sizes each family runs.
struct Sweep {
  std::vector<int64_t> linear_tokens;      // T of every linear
  std::vector<int64_t> moe_tokens;         // T of the MoE
  std::vector<std::string> moe_formats;    // NVFP4, MXFP4
  std::vector<std::string> moe_routings;   // routed-only cases: random, skewed (CUDA backend only)
  bool moe_whole = true;                   // the whole op (shared expert included)
  std::vector<int64_t> dense_tokens;       // T of RMSNorm, RoPE, Hadamard, HcPre, HcPost, KV write, compressor
  std::vector<int64_t> attention_batches;  // B decode sequences
  std::vector<int64_t> attention_contexts;  // ratio 128 at each; ratio 0 and 4 at the first
  std::vector<std::string> attention_kernels;  // mma, simt
  std::vector<int64_t> indexer_batches, indexer_contexts;
  std::vector<int64_t> indexer_pool8x_batches;  // B of the 8x-pool cases (at the first indexer context)
};

struct Bench {
  kernels::Backend& backend;  // the primary backend (cuda with the MMA attention kernel, or cpu)
  bool cuda = false;          // whether it is the CUDA backend
  kernels::StepLimits limits;  // what Reserve was given (an extra backend reserves the same)
  Shapes shapes;
  Sweep sweep;
  Runner& runner;
  Report& report;
  double rotate_bytes = 256e6;  // streamed data cycled per replay (sets * bytes per set reach at least this)
  int max_sets = 2048;
  uint64_t seed = 1;

  // Sets of `bytes_per_set` streamed bytes that reach the rotation target, in [1, max_sets] (1 in smoke mode).
  int SetsFor(double bytes_per_set) const;
  // Times the case, records and prints its row, and returns it.
  Result Run(kernels::Backend& b, const Case& c) {
    Result r = runner.Run(b, c);
    report.Add(r);
    return r;
  }
  // Records a case that could not be set up.
  void Fail(const std::string& family, const std::string& op, const std::string& shape, const absl::Status& s);
};

// OK when all n floats at `p` (backend memory) are finite; else an error naming `what` and the first bad index.
absl::Status CheckFinite(kernels::Backend& backend, const float* p, int64_t n, const std::string& what);
// Fills n floats of backend memory with NaN (outputs an op forgets to write then fail CheckFinite).
void Poison(kernels::Backend& backend, float* p, int64_t n);

// The families (one file each).
void RunLinearCases(Bench& b);     // linear_cases.cc
void RunMoeCases(Bench& b);        // moe_cases.cc
void RunIndexerCases(Bench& b);    // indexer_cases.cc
void RunAttentionCases(Bench& b);  // attention_cases.cc
void RunDenseCases(Bench& b);      // dense_cases.cc: RMSNorm, RoPE, HadamardFp4, HcPre, HcPost
void RunCacheCases(Bench& b);      // cache_cases.cc: KvWindowWrite, the three compressors

}  // namespace dsv4::bench
