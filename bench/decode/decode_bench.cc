// dsv4-decode-bench's engine: see decode_bench.h.
#include "bench/decode/decode_bench.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "bench/decode/cache_fill.h"
#include "bench/decode/comm_standin.h"
#include "bench/decode/routing_probe.h"
#include "bench/decode/synthetic_weights.h"
#include "bench/ops/runner.h"
#include "bench/ops/synth.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/backend_factory.h"
#include "kernels/device_control.h"
#include "model/dsv4/model.h"
#include "model/dsv4/shard.h"
#include "tools/make_checkpoint/generator.h"
#include "worker/graph_runner.h"

namespace dsv4::bench {
namespace {

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Device bytes one layer takes at the sweep's largest point: its weights (the largest layer, a ratio-4 one) and
// its KV slices for max_batch sequences of max_positions.
int64_t LayerBytes(const Config& full, ExpertFormat experts, int world, int max_batch, int64_t max_positions) {
  const WeightBytes all = CountWeightBytes(full, experts, world);
  // Weights: the resident bytes minus the embedding and the head, spread over the layers (a ratio-4 layer's excess
  // is small next to its experts); KV: a ratio-4 layer's (the largest) for every layer.
  const int64_t per_layer_weights =
      (all.resident - all.embed_row * full.vocab_size * 2) / std::max<int64_t>(1, full.num_hidden_layers);
  const int64_t kv = (max_positions / 4) * (584 + full.index_head_dim * 4) + full.sliding_window * 584 +
                     max_positions / 128 * 584;
  return per_layer_weights + int64_t{max_batch} * kv;
}

}  // namespace

struct DecodeBench::State {
  DecodeBenchOptions o;
  RunInfo info;
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<StandInCollectives> comm;
  std::unique_ptr<model::Dsv4Model> model;
  CachePlan plan;
  std::unique_ptr<worker::GraphRunner> runner;
  std::map<int, int64_t> nodes;  // per batch
  std::map<int, std::unique_ptr<PhaseRecorder>> recorders;
  std::map<int, std::unique_ptr<kernels::StepGraph>> timed_graphs;
  int64_t held_begin = 0, held_end = 0, shared_inter = 0;
  kernels::DeviceControl* device = nullptr;
};

DecodeBench::DecodeBench(std::unique_ptr<State> state) : s_(std::move(state)) {}
DecodeBench::~DecodeBench() {
  if (s_ != nullptr) {
    s_->timed_graphs.clear();
    s_->runner.reset();
  }
}
const RunInfo& DecodeBench::info() const { return s_->info; }

absl::StatusOr<std::unique_ptr<DecodeBench>> DecodeBench::Setup(const DecodeBenchOptions& o) {
  auto s = std::make_unique<State>();
  s->o = o;
  if (o.batches.empty() || o.contexts.empty()) return absl::InvalidArgumentError("--batches and --context must not be empty");
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    return absl::InvalidArgumentError(absl::StrCat("--simulate-rank ", o.rank, " out of [0, --simulate-world ", o.world, ")"));
  const int max_batch = *std::max_element(o.batches.begin(), o.batches.end());
  const int64_t max_ctx = *std::max_element(o.contexts.begin(), o.contexts.end());
  const int64_t max_positions = max_ctx + 1;

  DSV4_ASSIGN_OR_RETURN(s->backend, kernels::MakeBackend({.name = o.backend, .threads = o.threads, .device = o.device,
                                                          .attention_kernel = o.attention_kernel}));
  kernels::Backend& be = *s->backend;
  s->device = be.device_control();
  s->info.graphs = s->device != nullptr;
  s->info.device = GetDeviceInfo(be).name;

  // The config, cut to the layers asked for.
  DSV4_ASSIGN_OR_RETURN(const std::string text, ReadFile(o.config_path));
  DSV4_ASSIGN_OR_RETURN(const Config full, ParseConfig(text));
  int64_t layers = full.num_hidden_layers;
  if (o.layers == "fit") {
    if (s->device == nullptr) return absl::InvalidArgumentError("--layers fit needs a device backend");
    DSV4_ASSIGN_OR_RETURN(const kernels::DeviceMemory mem, s->device->Memory());
    const WeightBytes wb = CountWeightBytes(full, o.experts, o.world);
    const int64_t globals = wb.embed_row * full.vocab_size * 2;  // embedding + head
    const int64_t per_layer = LayerBytes(full, o.experts, o.world, max_batch, max_positions);
    const int64_t avail = mem.free - globals - static_cast<int64_t>(o.fit_reserve_gib * (1 << 30));
    layers = std::clamp<int64_t>(avail / std::max<int64_t>(1, per_layer), 1, full.num_hidden_layers);
    DSV4_LOG_INFO("--layers fit: {} GiB free, {:.2f} GiB per layer at batch {} context {}: {} layers",
                  mem.free >> 30, per_layer / double(1 << 30), max_batch, max_ctx, layers);
  } else if (o.layers != "all") {
    if (!absl::SimpleAtoi(o.layers, &layers) || layers < 1 || layers > full.num_hidden_layers)
      return absl::InvalidArgumentError(absl::StrCat("--layers must be all, fit or 1..", full.num_hidden_layers,
                                                     ", got '", o.layers, "'"));
  }
  DSV4_ASSIGN_OR_RETURN(const std::string cut, gen::OutputConfigJson(text, layers));
  DSV4_ASSIGN_OR_RETURN(s->info.config, ParseConfig(cut));
  const Config& c = s->info.config;
  s->info.layers = static_cast<int>(c.num_hidden_layers);
  s->info.weight_bytes = CountWeightBytes(c, o.experts, o.world);

  DSV4_ASSIGN_OR_RETURN(const double copy_bps,
                        MeasureCopyBandwidth(be, s->device != nullptr ? int64_t{1} << 30 : int64_t{32} << 20));
  s->info.copy_gbs = copy_bps / 1e9;

  auto t0 = std::chrono::steady_clock::now();
  DSV4_ASSIGN_OR_RETURN(SyntheticWeights synth, MakeSyntheticWeights(c, o.experts, o.routing, o.seed));
  s->info.synth_seconds = Seconds(t0);
  s->info.synth_host_bytes = synth.host_bytes;
  s->info.hot_bias = synth.hot_bias;

  model::ModelOptions mo{.mode = model::NumericMode::kProduction, .backend = &be,
                         .shard = {.rank = o.rank, .world = o.world}};
  if (o.world > 1) {
    s->comm = std::make_unique<StandInCollectives>(o.rank, o.world);
    mo.collectives = s->comm.get();
    DSV4_ASSIGN_OR_RETURN(const model::ShardLayout layout, model::PlanShardLayout(c, mo.shard));
    s->held_begin = layout.experts.begin;
    s->held_end = layout.experts.end();
    s->shared_inter = layout.shared_inter.size;
  } else {
    s->held_end = c.n_routed_experts;
    s->shared_inter = c.moe_intermediate_size * c.n_shared_experts;
  }
  mo.fuse_projections = o.fuse_projections;
  mo.max_step_tokens = max_batch;
  mo.max_context = (max_positions + 255) / 128 * 128;
  mo.on_layer_loaded = [](int done, int total) {
    if (done % 8 == 0 || done == total) DSV4_LOG_INFO("synthetic weights: {} of {} layers loaded", done, total);
  };
  t0 = std::chrono::steady_clock::now();
  DSV4_ASSIGN_OR_RETURN(s->model, model::Dsv4Model::Load(*synth.checkpoint, c, mo));
  synth.checkpoint.reset();  // the backend holds its own copies
  s->info.load_seconds = Seconds(t0);

  t0 = std::chrono::steady_clock::now();
  s->plan = PlanCache(c, max_batch, max_positions, o.page_rows);
  DSV4_RETURN_IF_ERROR(s->model->AllocateCache(s->plan.pool_pages, o.page_rows, max_batch));
  DSV4_RETURN_IF_ERROR(FillCache(*s->model, be, o.page_rows, o.seed));
  s->info.fill_seconds = Seconds(t0);
  const auto held = be.allocated();
  for (int k = 0; k < 5; ++k) s->info.backend_bytes[k] = held[k];

  std::vector<int> buckets = o.batches;
  std::sort(buckets.begin(), buckets.end());
  buckets.erase(std::unique(buckets.begin(), buckets.end()), buckets.end());
  s->runner = std::make_unique<worker::GraphRunner>(*s->model, o.cuda_graphs ? s->device : nullptr, buckets);
  t0 = std::chrono::steady_clock::now();
  DSV4_ASSIGN_OR_RETURN(const worker::GraphCaptureReport report, s->runner->CaptureAll());
  s->info.capture_seconds = Seconds(t0);
  for (const auto& b : report.buckets) s->nodes[b.bucket] = b.nodes;
  return std::unique_ptr<DecodeBench>(new DecodeBench(std::move(s)));
}

absl::StatusOr<PointResult> DecodeBench::Run(int batch, int64_t context) {
  State& s = *s_;
  const Config& c = s.info.config;
  model::Dsv4Model& m = *s.model;
  if (context < 1 || context + 1 > s.plan.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("context ", context, " out of the planned [1, ", s.plan.max_positions - 1, "]"));
  }
  PointResult r{.batch = batch, .context = context};
  const std::vector<model::SeqBlockTables> tables = MakeTables(c, s.plan, batch, context + 1);
  Rng rng(s.o.seed * 31 + static_cast<uint64_t>(batch) * 7 + static_cast<uint64_t>(context));
  std::vector<int32_t> token_ids(static_cast<size_t>(batch)), out(static_cast<size_t>(batch));
  for (int32_t& t : token_ids) t = static_cast<int32_t>(rng.Int(c.vocab_size));
  std::vector<model::SeqChunk> chunks(static_cast<size_t>(batch));
  for (int b = 0; b < batch; ++b) {
    chunks[b] = {.tables = &tables[b], .tokens = std::span<const int32_t>(&token_ids[b], 1),
                 .start_pos = static_cast<int32_t>(context)};
  }
  const std::vector<kernels::SampleParams> sampling(static_cast<size_t>(batch));
  // Every step decodes at position `context` (the cache holds `context` rows per sequence; the step's own rows
  // are rewritten each time).
  auto rewind = [&]() -> absl::Status {
    for (int b = 0; b < batch; ++b) DSV4_RETURN_IF_ERROR(m.SetSlotPositionForBench(b, context));
    return absl::OkStatus();
  };
  auto step = [&](bool eager) -> absl::Status {
    DSV4_RETURN_IF_ERROR(rewind());
    return s.runner->RunDecodeSample(chunks, sampling, out.data(), eager);
  };
  const model::StepShape shape = model::StepShape::Decode(s.runner->BucketFor(batch));
  if (shape.seqs != batch) return absl::InvalidArgumentError(absl::StrCat("batch ", batch, " is not a bucket"));

  // 1. Wall time of the step as the worker runs it.
  for (int i = 0; i < s.o.warmup; ++i) DSV4_RETURN_IF_ERROR(step(false));
  std::vector<double> wall, prep, launch, finish;
  for (int i = 0; i < std::max(1, s.o.reps); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    DSV4_RETURN_IF_ERROR(step(false));
    wall.push_back(Seconds(t0) * 1e3);
    const auto& h = s.runner->last_step_times();
    prep.push_back(h.prepare_s * 1e3), launch.push_back(h.launch_s * 1e3), finish.push_back(h.finish_s * 1e3);
  }
  r.step_ms = Quantile(wall, 0.5);
  r.step_p10_ms = Quantile(wall, 0.1);
  r.step_p90_ms = Quantile(wall, 0.9);
  r.host_prepare_ms = Quantile(prep, 0.5);
  r.host_launch_ms = Quantile(launch, 0.5);
  r.host_finish_ms = Quantile(finish, 0.5);
  r.tokens_per_s = batch / (r.step_ms * 1e-3);

  // 2. Phases: a timed graph (the same EnqueueStep captured with event-record nodes at the phase marks), or eager
  // steps with the same marks as plain events.
  void* stream = s.device != nullptr ? s.device->stream() : nullptr;
  std::vector<PhaseMs> samples;
  absl::Status graph_phases = absl::UnavailableError("graphs off");
  if (s.o.cuda_graphs && s.device != nullptr) {
    graph_phases = [&]() -> absl::Status {
      if (!s.timed_graphs.contains(batch)) {
        DSV4_ASSIGN_OR_RETURN(s.recorders[batch], PhaseRecorder::Make(stream));
        m.SetPhaseHook(s.recorders[batch].get());
        absl::StatusOr<std::unique_ptr<kernels::StepGraph>> g =
            s.device->Capture([&] { return m.EnqueueStep(shape, /*sample=*/true); });
        m.SetPhaseHook(nullptr);
        DSV4_RETURN_IF_ERROR(g.status());
        s.timed_graphs[batch] = std::move(*g);
      }
      for (int i = 0; i < std::max(1, s.o.phase_reps); ++i) {
        DSV4_RETURN_IF_ERROR(rewind());
        DSV4_RETURN_IF_ERROR(m.PrepareStep(chunks, shape, sampling));
        DSV4_RETURN_IF_ERROR(s.device->Launch(*s.timed_graphs[batch]));
        DSV4_RETURN_IF_ERROR(m.FinishStepTokens(out.data(), batch));
        DSV4_ASSIGN_OR_RETURN(PhaseMs p, s.recorders[batch]->Read());
        samples.push_back(p);
      }
      return absl::OkStatus();
    }();
    if (!graph_phases.ok()) {
      DSV4_LOG_WARN("batch {}: timed graph replay failed ({}); phases from eager steps", batch, graph_phases.ToString());
      samples.clear();
    }
  }
  if (graph_phases.ok()) {
    r.phase_source = "graph replay";
  } else {
    r.phase_source = "eager";
    DSV4_ASSIGN_OR_RETURN(std::unique_ptr<PhaseRecorder> rec, PhaseRecorder::Make(stream));
    for (int i = 0; i < std::max(1, s.o.phase_reps); ++i) {
      rec->Reset();
      m.SetPhaseHook(rec.get());
      const absl::Status st = step(true);
      m.SetPhaseHook(nullptr);
      DSV4_RETURN_IF_ERROR(st);
      DSV4_ASSIGN_OR_RETURN(PhaseMs p, rec->Read());
      samples.push_back(p);
    }
  }
  std::vector<double> totals;
  for (const PhaseMs& p : samples) {
    double t = 0;
    for (double v : p) t += v;
    totals.push_back(t);
  }
  // The median sample by total, whole (so its phases add up to its total).
  const double med_total = Quantile(totals, 0.5);
  size_t pick = 0;
  for (size_t i = 0; i < totals.size(); ++i) {
    if (std::abs(totals[i] - med_total) < std::abs(totals[pick] - med_total)) pick = i;
  }
  r.phase_ms = samples[pick];
  r.gpu_ms = totals[pick];

  // 3. Graph nodes per step.
  if (auto it = s.nodes.find(batch); it != s.nodes.end()) {
    r.graph_nodes = it->second;
  } else if (s.device != nullptr) {  // graphs off: capture once just to count
    absl::StatusOr<std::unique_ptr<kernels::StepGraph>> g = s.device->Capture([&] { return m.EnqueueStep(shape, true); });
    if (g.ok()) s.nodes[batch] = r.graph_nodes = (*g)->nodes();
  }

  // 4. Routing and collectives of one eager step (the probe reads the MoE's counts per layer; the stand-in counts
  // what the collectives would move: in graph replays they are not called from the host at all).
  if (s.comm != nullptr) s.comm->Reset();
  std::vector<std::vector<int32_t>> hot;
  if (s.o.routing.skewed) {
    for (int l = 0; l < c.num_hidden_layers; ++l) hot.push_back(HotExperts(s.o.routing, c.n_routed_experts, l));
  }
  double touched_total = 0;
  if (s.device != nullptr) {
    RoutingProbe probe(*s.backend, {.tokens = batch, .experts = c.n_routed_experts, .topk = c.num_experts_per_tok,
                                    .dim = c.hidden_size, .inter = c.moe_intermediate_size,
                                    .shared_inter = s.shared_inter, .held_begin = s.held_begin,
                                    .held_end = s.held_end, .hot = hot});
    m.SetPhaseHook(&probe);
    const absl::Status st = step(true);
    m.SetPhaseHook(nullptr);
    DSV4_RETURN_IF_ERROR(st);
    DSV4_RETURN_IF_ERROR(probe.status());
    if (static_cast<int64_t>(probe.layers().size()) != c.num_hidden_layers) {
      return absl::InternalError(absl::StrCat("routing probe saw ", probe.layers().size(), " MoE layers of ",
                                              c.num_hidden_layers));
    }
    int64_t pairs = 0, hot_pairs = 0;
    for (const LayerRouting& l : probe.layers()) touched_total += static_cast<double>(l.touched), pairs += l.pairs, hot_pairs += l.hot_pairs;
    r.routing_measured = true;
    if (s.o.routing.skewed && pairs > 0) r.hot_share = static_cast<double>(hot_pairs) / static_cast<double>(pairs);
  } else {
    DSV4_RETURN_IF_ERROR(step(true));
    touched_total = c.num_hidden_layers * ExpectedTouched(s.o.routing, c.n_routed_experts, s.held_end - s.held_begin,
                                                          c.num_experts_per_tok, batch);
  }
  r.experts_touched_per_layer = touched_total / c.num_hidden_layers;
  if (s.comm != nullptr) {
    r.all_reduces = s.comm->all_reduces();
    r.all_reduce_bytes = s.comm->all_reduce_bytes();
    r.gathers = s.comm->gathers();
    r.gather_bytes = s.comm->gather_bytes();
    r.comm_modelled_ms = 1e3 * ModelledCommSeconds(r.all_reduces, r.all_reduce_bytes, r.gathers, r.gather_bytes,
                                                   s.o.world, s.o.comm_busbw_gbs * 1e9, s.o.comm_latency_us * 1e-6);
  }

  // 5. The byte floor.
  const WeightBytes& w = s.info.weight_bytes;
  const KvBytes kv = CountKvBytes(c, context);
  r.floor_weight_bytes = static_cast<double>(w.dense + w.embed_row * batch);
  r.floor_expert_bytes = touched_total * static_cast<double>(w.per_expert);
  r.floor_kv_bytes = static_cast<double>(kv.attention) * batch;
  r.floor_indexer_bytes = static_cast<double>(kv.indexer) * batch;
  r.floor_bytes = r.floor_weight_bytes + r.floor_expert_bytes + r.floor_kv_bytes + r.floor_indexer_bytes;
  r.floor_ms = r.floor_bytes / (s.info.copy_gbs * 1e9) * 1e3;
  r.pct_of_floor = 100.0 * r.floor_ms / r.step_ms;
  return r;
}

}  // namespace dsv4::bench
