// dsv4-decode-bench's engine: builds the model of a config with synthetic weights (synthetic_weights.h) on a
// backend, through Dsv4Model::Load and the backend's own weight preparation; plans and fills the KV pools for the
// largest (batch, context) of the sweep (cache_fill.h); captures the worker's decode graphs (worker::GraphRunner,
// one per batch) and times real decode steps at each (batch, context): wall time per step as the worker runs it
// (plan in, graph replay, sampled tokens out), GPU time by phase from a timed replay (phase_recorder.h), graph
// nodes, the routing the step actually took (routing_probe.h) and the byte floor (byte_floor.h).
// docs/decode-bench.md explains every column.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/decode/byte_floor.h"
#include "bench/decode/phase_recorder.h"
#include "bench/decode/routing.h"
#include "model/config/config.h"
#include "model/config/tensor_inventory.h"

namespace dsv4::bench {

struct DecodeBenchOptions {
  std::string backend = "cuda";
  int device = 0;
  int threads = 0;                 // cpu backend threads
  std::string config_path = "configs/flash.json";
  std::string layers = "all";      // all | fit | N
  int rank = 0, world = 1;         // --simulate-rank / --simulate-world
  ExpertFormat experts = ExpertFormat::kNvfp4;
  RoutingSpec routing;
  std::vector<int> batches = {1, 8, 32, 64, 128};
  std::vector<int64_t> contexts = {8192, 32768};
  bool cuda_graphs = true;
  std::string attention_kernel = "mma";
  bool fuse_projections = true;  // ModelOptions::fuse_projections (the projections of one input as one op)
  int warmup = 3;                  // untimed steps per point
  int reps = 10;                   // timed steps per point (median)
  int phase_reps = 3;              // timed replays per point (median per phase)
  int page_rows = 64;
  uint64_t seed = 1;
  double fit_reserve_gib = 12;     // --layers fit: device memory left for workspace, graphs, scratch
  double comm_busbw_gbs = 0;       // modelled all-reduce bus bandwidth (GB/s); 0: no model
  double comm_latency_us = 0;      // modelled per-collective latency
};

// What a run measured once (before the points).
struct RunInfo {
  std::string device{};
  Config config{};                // as run (layers cut)
  int layers = 0;
  bool graphs = false;             // the backend captures graphs (CUDA)
  double copy_gbs = 0;             // device-to-device copy bandwidth (read + write bytes / s / 1e9)
  double synth_seconds = 0, load_seconds = 0, fill_seconds = 0, capture_seconds = 0;
  int64_t synth_host_bytes = 0;
  std::array<int64_t, 5> backend_bytes{};  // weights, kv, state, workspace, host staging
  WeightBytes weight_bytes;
  double hot_bias = 0;
};

struct PointResult {
  int batch = 0;
  int64_t context = 0;
  double step_ms = 0;              // median wall time of a step (plan copy, graph launch or eager enqueue, tokens out)
  double step_p10_ms = 0, step_p90_ms = 0;
  double host_prepare_ms = 0, host_launch_ms = 0, host_finish_ms = 0;  // of the median step's kind (medians)
  double tokens_per_s = 0;
  double gpu_ms = 0;               // first to last phase mark of a timed step (sum of phases)
  PhaseMs phase_ms{};              // by model::Phase
  std::string phase_source{};      // "graph replay" or "eager"
  int64_t graph_nodes = 0;         // nodes of the step's graph (0: no graphs)
  double floor_weight_bytes = 0, floor_expert_bytes = 0, floor_kv_bytes = 0, floor_indexer_bytes = 0;
  double floor_bytes = 0, floor_ms = 0, pct_of_floor = 0;
  double experts_touched_per_layer = 0;  // mean over layers
  double hot_share = -1;           // measured share of pairs on hot experts (skewed; -1: not measured)
  bool routing_measured = false;   // false: expected values (no probe on this backend)
  int64_t all_reduces = 0, all_reduce_bytes = 0, gathers = 0, gather_bytes = 0;  // per step (stand-in)
  double comm_modelled_ms = 0;
};

class DecodeBench {
 public:
  static absl::StatusOr<std::unique_ptr<DecodeBench>> Setup(const DecodeBenchOptions& options);
  ~DecodeBench();
  absl::StatusOr<PointResult> Run(int batch, int64_t context);
  const RunInfo& info() const;

  struct State;

 private:
  explicit DecodeBench(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace dsv4::bench
