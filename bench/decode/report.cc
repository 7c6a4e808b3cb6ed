// The table, JSON and SVG of dsv4-decode-bench: see report.h.
#include "bench/decode/report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/config/tensor_inventory.h"

namespace dsv4::bench {

const char* PhaseName(int p) {
  static const char* kNames[kNumModelPhases] = {"attention", "moe", "dense", "comm", "other", "indexer"};
  return p >= 0 && p < kNumModelPhases ? kNames[p] : "?";
}

namespace {

// Table and JSON order: attention, indexer, MoE, dense, comm, other.
constexpr int kOrder[kNumModelPhases] = {0, 5, 1, 2, 3, 4};

double Share(const PointResult& r, int p) { return r.gpu_ms > 0 ? r.phase_ms[p] / r.gpu_ms : 0.0; }

}  // namespace

std::string TableHeader() {
  return "| batch | context | step ms | ms/layer | tok/s | gpu ms | attn | indexer | moe | dense | comm | other | "
         "nodes | experts/layer | floor GB | floor ms | % of floor |\n"
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
}

std::string TableRow(const PointResult& r, int layers) {
  std::string row = absl::StrFormat("| %d | %d | %.3f | %.3f | %.0f | %.3f |", r.batch, r.context, r.step_ms,
                                    r.step_ms / std::max(1, layers), r.tokens_per_s, r.gpu_ms);
  for (int p : kOrder) absl::StrAppendFormat(&row, " %.0f%% |", 100 * Share(r, p));
  absl::StrAppendFormat(&row, " %d | %.1f%s | %.3f | %.3f | %.0f%% |\n", r.graph_nodes, r.experts_touched_per_layer,
                        r.routing_measured ? "" : "*", r.floor_bytes / 1e9, r.floor_ms, r.pct_of_floor);
  return row;
}

nlohmann::json PointJson(const PointResult& r, int layers, int world) {
  nlohmann::json phases = nlohmann::json::object(), shares = nlohmann::json::object();
  for (int p : kOrder) {
    phases[PhaseName(p)] = r.phase_ms[p];
    shares[PhaseName(p)] = Share(r, p);
  }
  nlohmann::json j = {
      {"batch", r.batch},
      {"context", r.context},
      {"step_ms", r.step_ms},
      {"step_p10_ms", r.step_p10_ms},
      {"step_p90_ms", r.step_p90_ms},
      {"ms_per_layer", r.step_ms / std::max(1, layers)},
      {"tokens_per_s", r.tokens_per_s},
      {"host_ms", {{"prepare", r.host_prepare_ms}, {"launch", r.host_launch_ms}, {"finish", r.host_finish_ms}}},
      {"gpu_ms", r.gpu_ms},
      {"phase_ms", phases},
      {"phase_share", shares},
      {"phase_source", r.phase_source},
      {"graph_nodes", r.graph_nodes},
      {"graph_nodes_per_layer", static_cast<double>(r.graph_nodes) / std::max(1, layers)},
      {"routing", {{"measured", r.routing_measured}, {"experts_touched_per_layer", r.experts_touched_per_layer},
                   {"hot_share", r.hot_share}}},
      {"floor", {{"weight_bytes", r.floor_weight_bytes}, {"expert_bytes", r.floor_expert_bytes},
                 {"kv_bytes", r.floor_kv_bytes}, {"indexer_bytes", r.floor_indexer_bytes},
                 {"bytes", r.floor_bytes}, {"ms", r.floor_ms}}},
      {"bytes_moved", r.floor_bytes},
      {"achieved_gbs", r.floor_bytes / (r.step_ms * 1e-3) / 1e9},
      {"pct_of_floor", r.pct_of_floor},
      {"comm", {{"all_reduces", r.all_reduces}, {"all_reduce_bytes", r.all_reduce_bytes},
                {"all_reduce_bus_bytes", world > 1 ? 2.0 * (world - 1) / world * static_cast<double>(r.all_reduce_bytes) : 0.0},
                {"gathers", r.gathers}, {"gather_bytes", r.gather_bytes}, {"modelled_ms", r.comm_modelled_ms}}},
  };
  if (world > 1) j["projected_tpot_ms"] = r.step_ms + r.comm_modelled_ms;
  return j;
}

nlohmann::json RunJson(const RunInfo& info, const DecodeBenchOptions& o) {
  const WeightBytes& w = info.weight_bytes;
  return {
      {"device", info.device},
      {"config", o.config_path},
      {"layers", info.layers},
      {"simulate_rank", o.rank},
      {"simulate_world", o.world},
      {"experts", std::string(ExpertFormatName(o.experts))},
      {"routing", o.routing.skewed ? "skewed" : "random"},
      {"hot_bias", info.hot_bias},
      {"cuda_graphs", o.cuda_graphs},
      {"attention_kernel", o.attention_kernel},
      {"fuse_projections", o.fuse_projections},
      {"copy_gbs", info.copy_gbs},
      {"seconds", {{"synthesis", info.synth_seconds}, {"load", info.load_seconds}, {"kv_fill", info.fill_seconds},
                   {"capture", info.capture_seconds}}},
      {"synthetic_host_bytes", info.synth_host_bytes},
      {"backend_bytes", {{"weights", info.backend_bytes[0]}, {"kv_cache", info.backend_bytes[1]},
                         {"state", info.backend_bytes[2]}, {"workspace", info.backend_bytes[3]},
                         {"host_staging", info.backend_bytes[4]}}},
      {"weight_bytes", {{"dense_per_step", w.dense}, {"per_expert", w.per_expert}, {"experts_held_per_layer", w.experts_held},
                        {"resident", w.resident}}},
      {"comm_model", {{"busbw_gbs", o.comm_busbw_gbs}, {"latency_us", o.comm_latency_us}}},
      {"warmup", o.warmup},
      {"reps", o.reps},
      {"phase_reps", o.phase_reps},
      {"seed", o.seed},
  };
}

absl::Status WriteJson(const std::string& path, const nlohmann::json& run, const std::vector<PointResult>& points,
                       int world) {
  nlohmann::json j = {{"run", run}, {"points", nlohmann::json::array()}};
  const int layers = run.value("layers", 1);
  for (const PointResult& r : points) j["points"].push_back(PointJson(r, layers, world));
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::Status WriteSvg(const std::string& path, const std::string& title, const std::vector<PointResult>& points) {
  if (points.empty()) return absl::InvalidArgumentError("no points to draw");
  std::map<int64_t, std::vector<const PointResult*>> by_ctx;
  double ymax = 0;
  int bmin = points[0].batch, bmax = points[0].batch;
  for (const PointResult& r : points) {
    by_ctx[r.context].push_back(&r);
    ymax = std::max({ymax, r.step_ms, r.floor_ms});
    bmin = std::min(bmin, r.batch), bmax = std::max(bmax, r.batch);
  }
  const double W = 720, H = 440, L = 70, R = 170, T = 40, B = 50;
  const double lb0 = std::log2(std::max(1, bmin)), lb1 = std::max(lb0 + 1, std::log2(std::max(1, bmax)));
  auto x = [&](int b) { return L + (std::log2(std::max(1, b)) - lb0) / (lb1 - lb0) * (W - L - R); };
  ymax *= 1.1;
  auto y = [&](double ms) { return H - B - ms / ymax * (H - T - B); };
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%.0f\" y=\"22\" font-size=\"14\">%s</text>\n",
      W, H, L, title);
  absl::StrAppendFormat(&s, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, H - B,
                        W - R, H - B);
  absl::StrAppendFormat(&s, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"black\"/>\n", L, T, L, H - B);
  for (int i = 0; i <= 5; ++i) {
    const double v = ymax * i / 5;
    absl::StrAppendFormat(&s, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\">%.2f</text>\n", L - 6, y(v) + 4, v);
    absl::StrAppendFormat(&s, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y(v),
                          W - R, y(v));
  }
  std::vector<int> batches;
  for (const PointResult& r : points) batches.push_back(r.batch);
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  for (int b : batches) {
    absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%d</text>\n", x(b), H - B + 16, b);
  }
  absl::StrAppendFormat(&s, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">batch (sequences per step)</text>\n",
                        (L + W - R) / 2, H - 12);
  absl::StrAppendFormat(&s, "<text x=\"16\" y=\"%.0f\" transform=\"rotate(-90 16 %.0f)\" text-anchor=\"middle\">"
                            "ms per decode step</text>\n", (T + H - B) / 2, (T + H - B) / 2);
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  int ci = 0, legend = 0;
  for (auto& [ctx, rs] : by_ctx) {
    std::sort(rs.begin(), rs.end(), [](auto* a, auto* b) { return a->batch < b->batch; });
    const char* color = kColors[ci++ % 5];
    std::string step, floor;
    for (const PointResult* r : rs) {
      absl::StrAppendFormat(&step, "%.1f,%.1f ", x(r->batch), y(r->step_ms));
      absl::StrAppendFormat(&floor, "%.1f,%.1f ", x(r->batch), y(r->floor_ms));
      absl::StrAppendFormat(&s, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x(r->batch), y(r->step_ms), color);
    }
    absl::StrAppendFormat(&s, "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n", step, color);
    absl::StrAppendFormat(&s, "<polyline points=\"%s\" fill=\"none\" stroke=\"%s\" stroke-dasharray=\"5,4\"/>\n",
                          floor, color);
    const double ly = T + 16 + 36 * legend++;
    absl::StrAppendFormat(&s, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\"/>"
                              "<text x=\"%.0f\" y=\"%.0f\">step, context %d</text>\n",
                          W - R + 10, ly, W - R + 30, ly, color, W - R + 36, ly + 4, ctx);
    absl::StrAppendFormat(&s, "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" "
                              "stroke-dasharray=\"5,4\"/><text x=\"%.0f\" y=\"%.0f\">byte floor</text>\n",
                          W - R + 10, ly + 16, W - R + 30, ly + 16, color, W - R + 36, ly + 20);
  }
  s += "</svg>\n";
  std::ofstream out(path);
  out << s;
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace dsv4::bench
