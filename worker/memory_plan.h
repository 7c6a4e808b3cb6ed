// A worker's start-up memory (issue 15 §3): sizes the KV pools, allocates them (ModelExecutor::AllocateCache, which
// also plans the step workspace and the ops' scratch) and captures the CUDA graphs, in that order, then logs one
// table of where the memory went and how many sequences of --max-context fit at once.
//
// CPU backend: the pools take --mem-fraction of MemAvailable (PlanKvSizing), or --kv-pages; no graphs.
// Device backend: --gpu-memory-fraction f of the device's total memory is the worker's whole budget:
//   1. allocate a minimal cache (--max-batch window rings + one request of --max-context): the workspace and the
//      scratch come with it, so the device's used memory is now everything but the pools' growth - weights,
//      workspace, scratch, compressor state, CUDA context, NCCL buffers (and any other process's memory);
//   2. pools' budget = f x total - (used - the minimal pools) - a reserve for the graphs, and never more than is free;
//   3. size the pools in it (or take --kv-pages) and allocate them (the minimal cache is dropped);
//   4. capture the graphs (GraphBuckets); their measured memory goes into the table, with a warning when it exceeds
//      the reserve (the budget then overshoots by the difference).
// Any failure (too little memory for one request of --max-context, a capture that fails) is an error naming it.
//
// Threads: start-up, before the engine thread exists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/kv_manager.h"
#include "worker/model_executor.h"

namespace dsv4::worker {

struct MemoryPlanRequest {
  KvSizingRequest kv;               // page_rows, max_batch, max_context, kv_pages; cpu: mem_fraction, available_bytes
  double gpu_memory_fraction = 0.9;  // device backends
  std::vector<int> graph_buckets;    // GraphBuckets(options): decode steps pad to them; empty: no padding
  bool capture_graphs = true;        // --cuda-graphs: one CUDA graph per bucket (false: padded steps run eagerly)
  int64_t graph_reserve_per_bucket = int64_t{16} << 20;  // device bytes set aside per graph before capture
};

struct MemoryPlan {
  KvSizing sizing;
  GraphCaptureReport graphs;
  int64_t max_context_seqs = 0;  // sequences of --max-context that run at once (pools and --max-batch)
  int64_t budget_bytes = 0;      // device: f x total; cpu: the pools' share of MemAvailable
  std::string table;             // the start-up table (multi-line), also logged
};

absl::StatusOr<MemoryPlan> PlanMemory(ModelExecutor& executor, const MemoryPlanRequest& request);

}  // namespace dsv4::worker
