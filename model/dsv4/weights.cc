// Loading the weights into the backend: see weights.h.
#include "model/dsv4/weights.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/float_formats.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/device_control.h"
#include "model/checkpoint/stream_reader.h"

namespace dsv4::model {
namespace {

std::string Shape(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ","), "]"); }

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A plain tensor of BF16 or F32 with exactly `shape` (a scalar [] is accepted for shape [1]) as host fp32.
absl::StatusOr<std::vector<float>> PlainToF32(const ckpt::TensorView& v, const std::string& name,
                                              const std::vector<int64_t>& shape) {
  const bool scalar_ok = v.shape.empty() && shape == std::vector<int64_t>{1};
  if (v.shape != shape && !scalar_ok) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected shape ", Shape(shape), ", found ", Shape(v.shape)));
  }
  std::vector<float> out(v.numel());
  for (int64_t i = 0; i < v.numel(); ++i) {
    if (v.dtype == ckpt::DType::kF32) {
      std::memcpy(&out[i], v.data + 4 * i, 4);
    } else if (v.dtype == ckpt::DType::kBF16) {
      uint16_t h;
      std::memcpy(&h, v.data + 2 * i, 2);
      out[i] = Bf16ToF32(h);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, ": expected BF16 or F32, found ", ckpt::DTypeName(v.dtype)));
    }
    if (!std::isfinite(out[i])) return absl::DataLossError(absl::StrCat(name, ": non-finite value at ", i));
  }
  return out;
}

// Loads tensors into one layer (or the model) through the backend. One loader walks the model in one of three
// modes, always in the same order:
//   kMapped    tensors are views into the mapped checkpoint (today's CPU path);
//   kPlan      headers only: records every byte range the walk needs, in order, as stream items, and where the
//              walk lets go of them (Release); nothing reaches the backend and the bytes it sees are zeros;
//   kStreamed  the bytes come from the stream reader, in the planned order, out of the pinned staging ring.
// Release() marks where nothing handed out so far is needed any more (after each backend call, after a plain
// tensor was converted), which is when the stream may reuse their staging.
class Loader {
 public:
  enum class Mode { kMapped, kPlan, kStreamed };
  Loader(const ckpt::Checkpoint& ck, kernels::Backend& backend, Mode mode, ckpt::StreamReader* reader = nullptr)
      : ck_(ck), backend_(backend), mode_(mode), reader_(reader) {}

  // A whole tensor.
  absl::StatusOr<ckpt::TensorView> Tensor(const std::string& name) {
    if (mode_ == Mode::kMapped) {
      DSV4_ASSIGN_OR_RETURN(ckpt::TensorView v, ck_.Get(name));
      bytes_ += static_cast<int64_t>(v.nbytes);
      return v;
    }
    DSV4_ASSIGN_OR_RETURN(ckpt::TensorLocation at, ck_.Locate(name));
    ckpt::TensorView v = at.view;
    if (mode_ == Mode::kPlan) {
      Record({.name = name, .path = at.path, .ranges = {{at.offset, v.nbytes}}});
      v.data = Zeros(v.nbytes);
    } else {
      DSV4_ASSIGN_OR_RETURN(v.data, reader_->Take(name));
      bytes_ += static_cast<int64_t>(v.nbytes);
    }
    return v;
  }
  absl::StatusOr<std::vector<float>> PlainF32(const std::string& name, const std::vector<int64_t>& shape) {
    DSV4_ASSIGN_OR_RETURN(ckpt::TensorView v, Tensor(name));
    DSV4_ASSIGN_OR_RETURN(std::vector<float> host, PlainToF32(v, name, shape));
    Release();
    return host;
  }
  // Rows x cols of linear `base` of logical [n, k] as host bytes in its format (shard.h's ReadLinearBlock).
  absl::StatusOr<HostLinear> LinearBytes(const std::string& base, int64_t n, int64_t k, Range rows, Range cols) {
    if (mode_ == Mode::kMapped) {
      DSV4_ASSIGN_OR_RETURN(HostLinear h, ReadLinearBlock(ck_, base, n, k, rows, cols));
      bytes_ += ViewBytes(h.view);
      return h;
    }
    DSV4_ASSIGN_OR_RETURN(LinearBlockPlan p, PlanLinearBlock(ck_, base, n, k, rows, cols));
    if (p.dequantise) {  // off the format's blocks (a rare shard layout): dequantised from the mapping
      if (mode_ == Mode::kPlan) {
        HostLinear h;
        h.view = p.view;
        planned_bytes_ += ViewBytes(h.view);  // not streamed, but this rank's bytes all the same (the auto choice)
        return h;
      }
      DSV4_ASSIGN_OR_RETURN(HostLinear h, ReadLinearBlock(ck_, base, n, k, rows, cols));
      bytes_ += ViewBytes(h.view);
      return h;
    }
    HostLinear h;
    h.view = p.view;
    if (mode_ == Mode::kPlan) {  // nothing reads a linear's bytes during the plan walk: a stand-in pointer
      static const uint8_t kStandIn = 0;
      Record(p.data);
      h.view.data = &kStandIn;
      if (!p.scale.ranges.empty()) {
        Record(p.scale);
        h.view.scale = &kStandIn;
      }
      return h;
    }
    DSV4_ASSIGN_OR_RETURN(h.view.data, reader_->Take(p.data.name));
    bytes_ += static_cast<int64_t>(p.data.bytes());
    if (!p.scale.ranges.empty()) {
      DSV4_ASSIGN_OR_RETURN(h.view.scale, reader_->Take(p.scale.name));
      bytes_ += static_cast<int64_t>(p.scale.bytes());
    }
    return h;
  }

  absl::StatusOr<PlainTensor> Plain(const std::string& name, std::vector<int64_t> shape) {
    DSV4_ASSIGN_OR_RETURN(std::vector<float> host, PlainF32(name, shape));
    return Upload(std::move(shape), host);
  }
  absl::StatusOr<PlainTensor> Upload(std::vector<int64_t> shape, std::span<const float> host) {
    if (mode_ == Mode::kPlan) return PlainTensor{std::move(shape), {}};
    const auto t0 = std::chrono::steady_clock::now();
    DSV4_ASSIGN_OR_RETURN(kernels::Buffer b, backend_.UploadF32(host));
    prepare_seconds_ += Since(t0);
    return PlainTensor{std::move(shape), std::move(b)};
  }
  absl::StatusOr<kernels::Buffer> UploadI32(std::span<const int32_t> host) {
    if (mode_ == Mode::kPlan) return kernels::Buffer();
    const auto t0 = std::chrono::steady_clock::now();
    DSV4_ASSIGN_OR_RETURN(kernels::Buffer b, backend_.UploadI32(host));
    prepare_seconds_ += Since(t0);
    return b;
  }
  // Linear `base` of logical [n, k]: rows x cols of it (all when the ranges are empty).
  absl::StatusOr<kernels::LinearHandle> Linear(const std::string& base, int64_t n, int64_t k, Range rows = {},
                                               Range cols = {}) {
    if (rows.size == 0) rows = {0, n};
    if (cols.size == 0) cols = {0, k};
    DSV4_ASSIGN_OR_RETURN(HostLinear h, LinearBytes(base, n, k, rows, cols));
    kernels::LinearHandle handle;
    if (mode_ != Mode::kPlan) {
      const auto t0 = std::chrono::steady_clock::now();
      DSV4_ASSIGN_OR_RETURN(handle, backend_.PrepareLinear(h.view));
      prepare_seconds_ += Since(t0);
    }
    Release();
    return handle;
  }
  absl::StatusOr<kernels::ExpertsHandle> Experts(std::span<const kernels::WeightView> w1,
                                                 std::span<const kernels::WeightView> w3,
                                                 std::span<const kernels::WeightView> w2) {
    kernels::ExpertsHandle handle;
    if (mode_ != Mode::kPlan) {
      const auto t0 = std::chrono::steady_clock::now();
      DSV4_ASSIGN_OR_RETURN(handle, backend_.PrepareExperts(w1, w3, w2));
      prepare_seconds_ += Since(t0);
    }
    Release();
    return handle;
  }
  // Nothing handed out so far is needed any more.
  void Release() {
    if (mode_ == Mode::kStreamed) reader_->ReleaseTaken();
    if (mode_ == Mode::kPlan) {
      largest_hold_ = std::max(largest_hold_, hold_);
      hold_ = 0;
    }
  }

  Mode mode() const { return mode_; }
  int64_t bytes() const { return bytes_; }
  double prepare_seconds() const { return prepare_seconds_; }
  // kPlan: the items in order, the most bytes held between two releases, the largest item.
  std::vector<ckpt::StreamItem> TakeItems() { return std::move(items_); }
  int64_t largest_hold() const { return std::max(largest_hold_, hold_); }
  int64_t largest_item() const { return largest_item_; }
  int64_t planned_bytes() const { return planned_bytes_; }  // kPlan: every byte this rank will read

 private:
  static int64_t ViewBytes(const kernels::WeightView& v) {
    int64_t data = 0;
    switch (v.format) {
      case kernels::WeightFormat::kF32: data = v.n * v.k * 4; break;
      case kernels::WeightFormat::kBF16: data = v.n * v.k * 2; break;
      case kernels::WeightFormat::kFp8Block128: data = v.n * v.k + (v.n + 127) / 128 * ((v.k + 127) / 128); break;
      case kernels::WeightFormat::kNvfp4: data = v.n * v.k / 2 + v.n * v.k / 16; break;
      case kernels::WeightFormat::kMxfp4: data = v.n * v.k / 2 + v.n * v.k / 32; break;
    }
    return data;
  }
  void Record(ckpt::StreamItem item) {
    const int64_t b = static_cast<int64_t>(item.bytes());
    planned_bytes_ += b;
    hold_ += b;
    largest_item_ = std::max(largest_item_, b);
    items_.push_back(std::move(item));
  }
  // Zero bytes standing in for a plain tensor or table during the plan walk (they are converted on the host).
  const uint8_t* Zeros(uint64_t bytes) {
    if (zeros_.size() < bytes) zeros_.assign(bytes, 0);
    return zeros_.data();
  }

  const ckpt::Checkpoint& ck_;
  kernels::Backend& backend_;
  const Mode mode_;
  ckpt::StreamReader* const reader_;
  int64_t bytes_ = 0;
  double prepare_seconds_ = 0;
  std::vector<ckpt::StreamItem> items_;
  int64_t hold_ = 0, largest_hold_ = 0, largest_item_ = 0, planned_bytes_ = 0;
  std::vector<uint8_t> zeros_;
};

absl::StatusOr<CompressorWeights> LoadCompressor(Loader& ld, const std::string& p, int ratio, int64_t d, int64_t dim) {
  const int64_t cd = (ratio == 4 ? 2 : 1) * d;
  CompressorWeights c;
  DSV4_ASSIGN_OR_RETURN(c.wkv, ld.Linear(p + "wkv", cd, dim));
  DSV4_ASSIGN_OR_RETURN(c.wgate, ld.Linear(p + "wgate", cd, dim));
  DSV4_ASSIGN_OR_RETURN(c.ape, ld.Plain(p + "ape", {ratio, cd}));
  DSV4_ASSIGN_OR_RETURN(c.norm, ld.Plain(p + "norm.weight", {d}));
  return c;
}

absl::Status LoadAttention(Loader& ld, const Config& c, const std::string& p, LayerWeights& l, const ShardLayout* shard) {
  const int64_t D = c.hidden_size, H = c.num_attention_heads, Dh = c.head_dim, G = c.o_groups, OL = c.o_lora_rank;
  DSV4_ASSIGN_OR_RETURN(l.wq_a, ld.Linear(p + "wq_a", c.q_lora_rank, D));
  DSV4_ASSIGN_OR_RETURN(l.q_norm, ld.Plain(p + "q_norm.weight", {c.q_lora_rank}));
  DSV4_ASSIGN_OR_RETURN(l.wkv, ld.Linear(p + "wkv", Dh, D));
  DSV4_ASSIGN_OR_RETURN(l.kv_norm, ld.Plain(p + "kv_norm.weight", {Dh}));
  DSV4_ASSIGN_OR_RETURN(std::vector<float> sink, ld.PlainF32(p + "attn_sink", {H}));
  if (shard == nullptr) {
    DSV4_ASSIGN_OR_RETURN(l.wq_b, ld.Linear(p + "wq_b", H * Dh, c.q_lora_rank));
    DSV4_ASSIGN_OR_RETURN(l.wo_a, ld.Linear(p + "wo_a", G * OL, H * Dh / G));
    DSV4_ASSIGN_OR_RETURN(l.wo_b, ld.Linear(p + "wo_b", D, G * OL));
    DSV4_ASSIGN_OR_RETURN(l.attn_sink, ld.Upload({H}, sink));
  } else {  // this rank's heads; its groups (or its heads' columns of one group) of wo_a; those groups' columns of wo_b
    const Range group_rows{shard->groups.begin * OL, shard->groups.size * OL};
    DSV4_ASSIGN_OR_RETURN(l.wq_b, ld.Linear(p + "wq_b", H * Dh, c.q_lora_rank,
                                            {shard->heads.begin * Dh, shard->heads.size * Dh}));
    DSV4_ASSIGN_OR_RETURN(l.wo_a, ld.Linear(p + "wo_a", G * OL, H * Dh / G, group_rows, shard->group_cols));
    DSV4_ASSIGN_OR_RETURN(l.wo_b, ld.Linear(p + "wo_b", D, G * OL, {0, D}, group_rows));
    DSV4_ASSIGN_OR_RETURN(l.attn_sink, ld.Upload({shard->heads.size}, std::span<const float>(sink).subspan(
                                                                          shard->heads.begin, shard->heads.size)));
  }
  if (l.ratio > 0) {
    DSV4_ASSIGN_OR_RETURN(l.compressor, LoadCompressor(ld, p + "compressor.", l.ratio, Dh, D));
  }
  if (l.ratio == 4) {
    const int64_t IH = c.index_n_heads, ID = c.index_head_dim;
    DSV4_ASSIGN_OR_RETURN(l.idx_wq_b, ld.Linear(p + "indexer.wq_b", IH * ID, c.q_lora_rank));
    DSV4_ASSIGN_OR_RETURN(l.idx_weights_proj, ld.Linear(p + "indexer.weights_proj", IH, D));
    DSV4_ASSIGN_OR_RETURN(l.idx_compressor, LoadCompressor(ld, p + "indexer.compressor.", 4, ID, D));
  }
  return absl::OkStatus();
}

absl::StatusOr<kernels::Buffer> LoadTid2eid(Loader& ld, const Config& c, const std::string& name) {
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  DSV4_ASSIGN_OR_RETURN(ckpt::TensorView v, ld.Tensor(name));
  if ((v.dtype != ckpt::DType::kI64 && v.dtype != ckpt::DType::kI32) || v.shape != std::vector<int64_t>{c.vocab_size, K}) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected I64 [", c.vocab_size, ",", K, "], found ",
                                                   ckpt::DTypeName(v.dtype), " ", Shape(v.shape)));
  }
  std::vector<int32_t> ids(v.numel());
  for (int64_t i = 0; i < v.numel(); ++i) {
    int64_t e = 0;
    if (v.dtype == ckpt::DType::kI64) {
      std::memcpy(&e, v.data + 8 * i, 8);
    } else {
      int32_t e32;
      std::memcpy(&e32, v.data + 4 * i, 4);
      e = e32;
    }
    if (e < 0 || e >= E) return absl::InvalidArgumentError(absl::StrCat(name, ": expert id ", e, " at ", i, " out of [0,", E, ")"));
    ids[i] = static_cast<int32_t>(e);
  }
  ld.Release();
  return ld.UploadI32(ids);
}

absl::Status LoadFfn(Loader& ld, const Config& c, const std::string& p, LayerWeights& l, const ShardLayout* shard) {
  const int64_t D = c.hidden_size, E = c.n_routed_experts, I = c.moe_intermediate_size;
  DSV4_ASSIGN_OR_RETURN(l.gate, ld.Linear(p + "gate", E, D));
  if (l.hash) {
    DSV4_ASSIGN_OR_RETURN(l.tid2eid, LoadTid2eid(ld, c, p + "gate.tid2eid"));
  } else {
    DSV4_ASSIGN_OR_RETURN(l.gate_bias, ld.Plain(p + "gate.bias", {E}));
  }
  // The routed experts as views into the mapped checkpoint or the staging ring (all of the layer's at once: one
  // PrepareExperts); another rank's expert has an empty view.
  std::vector<HostLinear> w1(E), w3(E), w2(E);
  for (int64_t e = 0; e < E; ++e) {
    if (shard != nullptr && (e < shard->experts.begin || e >= shard->experts.end())) continue;
    const std::string x = absl::StrCat(p, "experts.", e, ".");
    DSV4_ASSIGN_OR_RETURN(w1[e], ld.LinearBytes(x + "w1", I, D, {0, I}, {0, D}));
    DSV4_ASSIGN_OR_RETURN(w3[e], ld.LinearBytes(x + "w3", I, D, {0, I}, {0, D}));
    DSV4_ASSIGN_OR_RETURN(w2[e], ld.LinearBytes(x + "w2", D, I, {0, D}, {0, I}));
  }
  std::vector<kernels::WeightView> v1(E), v3(E), v2(E);
  for (int64_t e = 0; e < E; ++e) v1[e] = w1[e].view, v3[e] = w3[e].view, v2[e] = w2[e].view;
  DSV4_ASSIGN_OR_RETURN(l.experts, ld.Experts(v1, v3, v2));
  const int64_t Is = I * c.n_shared_experts;
  const Range r = shard != nullptr ? shard->shared_inter : Range{0, Is};  // rows of w1/w3, columns of w2
  DSV4_ASSIGN_OR_RETURN(l.shared_w1, ld.Linear(p + "shared_experts.w1", Is, D, r, {0, D}));
  DSV4_ASSIGN_OR_RETURN(l.shared_w3, ld.Linear(p + "shared_experts.w3", Is, D, r, {0, D}));
  DSV4_ASSIGN_OR_RETURN(l.shared_w2, ld.Linear(p + "shared_experts.w2", D, Is, {0, D}, r));
  return absl::OkStatus();
}

// One walk over the model in the loader's mode.
absl::StatusOr<std::unique_ptr<ModelWeights>> Walk(Loader& ld, const Config& c, const ShardLayout* shard,
                                                   const std::function<void(int, int)>& on_layer) {
  auto w = std::make_unique<ModelWeights>();
  const int64_t D = c.hidden_size, S = c.hc_mult, V = c.vocab_size;
  DSV4_ASSIGN_OR_RETURN(w->embed, ld.Linear("embed", V, D));
  DSV4_ASSIGN_OR_RETURN(w->head, ld.Linear("head", V, D, shard != nullptr ? shard->vocab : Range{0, V}, {0, D}));
  DSV4_ASSIGN_OR_RETURN(w->norm, ld.Plain("norm.weight", {D}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_fn, ld.Plain("hc_head_fn", {S, S * D}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_base, ld.Plain("hc_head_base", {S}));
  DSV4_ASSIGN_OR_RETURN(w->hc_head_scale, ld.Plain("hc_head_scale", {1}));
  w->layers.resize(c.num_hidden_layers);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w->layers[i];
    l.ratio = c.CompressRatio(i);
    l.hash = c.IsHashLayer(i);
    const std::string p = absl::StrCat("layers.", i, ".");
    DSV4_ASSIGN_OR_RETURN(l.attn_norm, ld.Plain(p + "attn_norm.weight", {D}));
    DSV4_ASSIGN_OR_RETURN(l.ffn_norm, ld.Plain(p + "ffn_norm.weight", {D}));
    for (auto [site, fn, base, scale] : {std::tuple{"attn", &l.hc_attn_fn, &l.hc_attn_base, &l.hc_attn_scale},
                                         std::tuple{"ffn", &l.hc_ffn_fn, &l.hc_ffn_base, &l.hc_ffn_scale}}) {
      const std::string q = absl::StrCat(p, "hc_", site, "_");
      DSV4_ASSIGN_OR_RETURN(*fn, ld.Plain(q + "fn", {c.hc_mix_dim(), S * D}));
      DSV4_ASSIGN_OR_RETURN(*base, ld.Plain(q + "base", {c.hc_mix_dim()}));
      DSV4_ASSIGN_OR_RETURN(*scale, ld.Plain(q + "scale", {3}));
    }
    DSV4_RETURN_IF_ERROR(LoadAttention(ld, c, p + "attn.", l, shard));
    DSV4_RETURN_IF_ERROR(LoadFfn(ld, c, p + "ffn.", l, shard));
    if (on_layer && ld.mode() != Loader::Mode::kPlan) on_layer(i + 1, static_cast<int>(c.num_hidden_layers));
  }
  return w;
}


}  // namespace

absl::StatusOr<WeightLoadOptions::Mode> ParseWeightLoadMode(std::string_view name) {
  if (name == "auto") return WeightLoadOptions::Mode::kAuto;
  if (name == "mapped") return WeightLoadOptions::Mode::kMapped;
  if (name == "streamed") return WeightLoadOptions::Mode::kStreamed;
  return absl::InvalidArgumentError(
      absl::StrCat("weight load mode '", std::string(name), "' unknown: one of auto, mapped, streamed"));
}

LoadChoice ShouldStream(const WeightLoadOptions& options, bool has_device, bool in_memory, int64_t rank_bytes) {
  switch (options.mode) {
    case WeightLoadOptions::Mode::kStreamed: return {true, "streamed as asked"};
    case WeightLoadOptions::Mode::kMapped: return {false, "mapped as asked"};
    case WeightLoadOptions::Mode::kAuto: break;
  }
  if (!has_device) return {false, "auto: mapped, the backend has no device"};
  if (in_memory) return {false, "auto: mapped, the checkpoint is held in memory"};
  const double gb = static_cast<double>(rank_bytes) / 1e9, min_gb = static_cast<double>(options.auto_stream_min_bytes) / 1e9;
  if (rank_bytes < options.auto_stream_min_bytes) {
    return {false, absl::StrFormat("auto: mapped, %.2f GB for this rank is below the %.2f GB streaming threshold", gb,
                                   min_gb)};
  }
  return {true, absl::StrFormat("auto: streamed, %.2f GB for this rank (threshold %.2f GB)", gb, min_gb)};
}

std::string WeightLoadStats::ToString() const {
  const double gb = static_cast<double>(bytes) / 1e9;
  auto rate = [&](double s) { return s > 0 ? gb / s : 0.0; };
  const std::string why = choice.empty() ? "" : absl::StrCat(" [", choice, "]");
  if (!streamed) {
    return absl::StrFormat("mapped %.3f GB in %.2f s (%.2f GB/s)%s; backend prepare %.2f s%s", gb, seconds,
                           rate(seconds),
                           plan_seconds > 0 ? absl::StrFormat(" incl. the plan walk %.3f s", plan_seconds) : "",
                           prepare_seconds, why);
  }
  return absl::StrFormat(
      "streamed %.3f GB in %.2f s (%.2f GB/s): plan %.3f s, pinned staging %d MiB in %.2f s, read %.2f s (%d "
      "threads, %.2f GB/s), copy + prepare on the backend %.2f s (%.2f GB/s), waited for reads %.2f s",
      gb, seconds, rate(seconds), plan_seconds, static_cast<int>(staging_bytes >> 20), staging_seconds, read_seconds,
      threads, rate(read_seconds), prepare_seconds, rate(prepare_seconds), wait_seconds) + why;
}

absl::StatusOr<std::unique_ptr<ModelWeights>> LoadWeights(const ckpt::Checkpoint& ck, const Config& c,
                                                          kernels::Backend& backend, const ShardLayout* shard,
                                                          const std::function<void(int, int)>& on_layer,
                                                          const WeightLoadOptions& options, WeightLoadStats* stats) {
  if (c.n_shared_experts != 1) {
    return absl::InvalidArgumentError(absl::StrCat("n_shared_experts ", c.n_shared_experts, " unsupported (must be 1)"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  WeightLoadStats st;
  // Streaming reads the files directly; a checkpoint held in memory (the decode bench's synthetic weights) has none.
  if (options.mode == WeightLoadOptions::Mode::kStreamed && ck.in_memory()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: streamed loading reads checkpoint files; ", ck.dir(), " is held in memory"));
  }
  // Streaming is planned first (headers only, milliseconds): kAuto needs the plan's byte count to choose.
  const bool has_device = backend.device_control() != nullptr;
  std::optional<Loader> plan;
  if (options.mode == WeightLoadOptions::Mode::kStreamed ||
      (options.mode == WeightLoadOptions::Mode::kAuto && has_device && !ck.in_memory())) {
    plan.emplace(ck, backend, Loader::Mode::kPlan);
    DSV4_RETURN_IF_ERROR(Walk(*plan, c, shard, on_layer).status());
    st.plan_seconds = Since(t0);
  }
  const LoadChoice choice = ShouldStream(options, has_device, ck.in_memory(), plan ? plan->planned_bytes() : 0);
  st.streamed = choice.streamed;
  st.choice = choice.why;
  std::unique_ptr<ModelWeights> w;
  if (!st.streamed) {
    plan.reset();  // its item list is not needed
    Loader ld(ck, backend, Loader::Mode::kMapped);
    DSV4_ASSIGN_OR_RETURN(w, Walk(ld, c, shard, on_layer));
    st.bytes = ld.bytes();
    st.prepare_seconds = ld.prepare_seconds();
  } else {
    // Room for what the loader holds at once (wrapping in the ring can waste up to one item) and the read-ahead.
    const int64_t capacity = plan->largest_hold() + plan->largest_item() + std::max<int64_t>(0, options.read_ahead_bytes);
    const auto t1 = std::chrono::steady_clock::now();
    DSV4_ASSIGN_OR_RETURN(kernels::Buffer staging, backend.Allocate(capacity, kernels::MemoryKind::kHostStaging));
    st.staging_seconds = Since(t1);
    st.staging_bytes = capacity;
    {
      DSV4_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::StreamReader> reader,
                            ckpt::StreamReader::Start(plan->TakeItems(), staging.as<uint8_t>(), capacity,
                                                      {.threads = options.reader_threads,
                                                       .chunk_bytes = options.chunk_bytes}));
      Loader ld(ck, backend, Loader::Mode::kStreamed, reader.get());
      DSV4_ASSIGN_OR_RETURN(w, Walk(ld, c, shard, on_layer));
      if (reader->remaining() != 0) {
        return absl::InternalError(absl::StrCat("weight stream: ", reader->remaining(), " planned items not used"));
      }
      const ckpt::StreamStats rs = reader->stats();
      st.bytes = ld.bytes();
      st.prepare_seconds = ld.prepare_seconds();
      st.read_seconds = rs.read_seconds;
      st.wait_seconds = rs.consumer_wait_seconds;
      st.threads = rs.threads;
    }  // the readers are joined before the staging goes
  }
  st.seconds = Since(t0);
  DSV4_LOG_INFO("weights: {}", st.ToString());
  if (stats != nullptr) *stats = st;
  return w;
}

}  // namespace dsv4::model
