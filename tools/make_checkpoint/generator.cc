// The checkpoint generator; see generator.h.
#include "tools/make_checkpoint/generator.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "model/checkpoint/quantize.h"
#include "model/checkpoint/safetensors_writer.h"
#include "nlohmann/json.hpp"
#include "tools/make_checkpoint/param_init.h"

namespace dsv4::gen {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Keeps the first `layers` entries of a per-layer list member (when present) plus `tail` entries
// that follow the main layers (the MTP layers of compress_ratios).
void CutList(OrderedJson& j, const char* key, int64_t main_layers, int64_t layers, int64_t tail) {
  if (!j.contains(key) || !j[key].is_array()) return;
  OrderedJson cut = OrderedJson::array();
  for (int64_t i = 0; i < layers; ++i) cut.push_back(j[key][i]);
  for (int64_t i = 0; i < tail && main_layers + i < static_cast<int64_t>(j[key].size()); ++i) {
    cut.push_back(j[key][main_layers + i]);
  }
  j[key] = std::move(cut);
}

absl::Status CutLayers(OrderedJson& j, const Config& c, int64_t layers) {
  if (layers < 0 || layers > c.num_hidden_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layers ", layers, ": must be in [1, num_hidden_layers = ", c.num_hidden_layers, "]"));
  }
  if (layers == 0 || layers == c.num_hidden_layers) return absl::OkStatus();
  const int64_t L = c.num_hidden_layers;
  j["num_hidden_layers"] = layers;
  CutList(j, "compress_ratios", L, layers, c.num_nextn_predict_layers);
  CutList(j, "layer_types", L, layers, 0);
  CutList(j, "mlp_layer_types", L, layers, 0);
  if (j.contains("num_hash_layers") || !j.contains("mlp_layer_types")) {
    j["num_hash_layers"] = std::min(c.num_hash_layers, layers);
  }
  return absl::OkStatus();
}

// Generates one parameter's values and adds its tensors; `mu` serialises the writer.
absl::Status AddParam(ckpt::CheckpointWriter& writer, std::mutex& mu, const ParamSpec& p, const Config& c,
                      uint64_t seed) {
  const int64_t L = c.num_hidden_layers;
  if (p.kind == ParamKind::kTid2Eid) {
    const std::vector<uint8_t> bytes = Tid2EidBytes(p, c.n_routed_experts, seed);
    std::lock_guard<std::mutex> lock(mu);
    return writer.Add(p.name, ckpt::DType::kI64, p.shape, bytes);
  }
  if (!p.linear || p.format == ckpt::WeightFormat::kBF16 || p.format == ckpt::WeightFormat::kF32) {
    const std::vector<uint8_t> bytes = UnquantizedBytes(p, L, seed);
    std::lock_guard<std::mutex> lock(mu);
    return writer.Add(p.linear ? p.name + ".weight" : p.name, p.dtype, p.shape, bytes);
  }
  std::vector<float> values = FloatValues(p, L, seed);
  DSV4_ASSIGN_OR_RETURN(ckpt::QuantizedLinear q, ckpt::QuantizeLinear(p.format, values, p.shape[0], p.shape[1]));
  values = {};
  std::lock_guard<std::mutex> lock(mu);
  return ckpt::AddLinear(writer, p.name, q);
}

// Generates every parameter on `threads` threads; the writer's output does not depend on the order.
absl::Status WriteTensors(const std::vector<ParamSpec>& params, const Config& c, const GeneratorOptions& o,
                          int64_t expect_tensors, int64_t expect_bytes) {
  ckpt::CheckpointWriterOptions wo;
  wo.num_shards = o.shards;
  wo.overwrite = o.overwrite;
  DSV4_ASSIGN_OR_RETURN(std::unique_ptr<ckpt::CheckpointWriter> writer, ckpt::CheckpointWriter::Create(o.out_dir, wo));
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads = std::clamp(threads, 1, static_cast<int>(std::max<size_t>(params.size(), 1)));
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex writer_mu, error_mu;
  absl::Status error;
  auto work = [&] {
    while (!failed.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= params.size()) return;
      absl::Status s = AddParam(*writer, writer_mu, params[i], c, o.seed);
      if (!s.ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (error.ok()) error = absl::Status(s.code(), absl::StrCat(params[i].name, ": ", s.message()));
        failed = true;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  DSV4_RETURN_IF_ERROR(error);
  if (writer->num_tensors() != expect_tensors || static_cast<int64_t>(writer->total_bytes()) != expect_bytes) {
    return absl::InternalError(absl::StrCat("generator wrote ", writer->num_tensors(), " tensors / ",
                                            writer->total_bytes(), " bytes, the inventory says ", expect_tensors,
                                            " / ", expect_bytes));
  }
  return writer->Finish();
}

// Writes `text` to dir/name through a temporary file and a rename, so no reader sees half a file.
absl::Status WriteTextFile(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string path = dir + "/" + name, tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path, ": rename failed: ", ec.message()));
  return absl::OkStatus();
}

GenerateSummary Summarise(const Config& config, const std::vector<ParamSpec>& params) {
  GenerateSummary s;
  s.config = config;
  s.params = static_cast<int64_t>(params.size());
  for (const ParamSpec& p : params) {
    ++s.params_by_format[p.kind == ParamKind::kTid2Eid ? "I64" : std::string(ckpt::WeightFormatName(p.format))];
    for (const TensorSpec& t : TensorsOf(p)) {
      const std::string dtype(ckpt::DTypeName(t.dtype));
      ++s.tensors;
      s.bytes += t.nbytes();
      ++s.tensors_by_dtype[dtype];
      s.bytes_by_dtype[dtype] += t.nbytes();
    }
  }
  return s;
}

}  // namespace

std::string GenerateSummary::ToString() const {
  std::string out = absl::StrFormat("%d layers (+%d MTP), %d parameters, %d tensors, %.3f MiB of tensor data\n",
                                    config.num_hidden_layers, config.num_nextn_predict_layers, params, tensors,
                                    static_cast<double>(bytes) / (1 << 20));
  for (const auto& [format, count] : params_by_format) absl::StrAppendFormat(&out, "  %-13s %7d params\n", format, count);
  for (const auto& [dtype, count] : tensors_by_dtype) {
    absl::StrAppendFormat(&out, "  %-13s %7d tensors %12.3f MiB\n", dtype, count,
                          static_cast<double>(bytes_by_dtype.at(dtype)) / (1 << 20));
  }
  return out;
}

absl::StatusOr<std::string> OutputConfigJson(std::string_view config_json, int64_t layers) {
  DSV4_ASSIGN_OR_RETURN(Config input, ParseConfig(config_json));
  OrderedJson j = OrderedJson::parse(config_json.begin(), config_json.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  DSV4_RETURN_IF_ERROR(CutLayers(j, input, layers));
  const Fp8QuantizationConfig& q = input.quantization_config;
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", q.fmt}, {"scale_fmt", q.scale_fmt},
                              {"weight_block_size", q.weight_block_size}, {"activation_scheme", q.activation_scheme}};
  return j.dump(2) + "\n";
}

absl::StatusOr<GenerateSummary> GenerateCheckpoint(std::string_view config_json, const GeneratorOptions& o) {
  if (o.out_dir.empty()) return absl::InvalidArgumentError("--out: missing output folder");
  if (o.shards < 1) return absl::InvalidArgumentError(absl::StrCat("--shards ", o.shards, ": must be >= 1"));
  DSV4_ASSIGN_OR_RETURN(std::string out_json, OutputConfigJson(config_json, o.layers));
  DSV4_ASSIGN_OR_RETURN(Config config, ParseConfig(out_json));
  std::string quant_json;
  if (o.experts == ExpertFormat::kNvfp4) {
    config.hf_quant = Nvfp4ExpertsQuantConfig(config);
    quant_json = QuantConfigToJson(*config.hf_quant);
    DSV4_ASSIGN_OR_RETURN(ExpertFormat detected, DetectExpertFormat(config));
    if (detected != ExpertFormat::kNvfp4) return absl::InternalError("generated hf_quant_config.json is not NVFP4");
  }
  const std::vector<ParamSpec> params = ParamInventory(config, o.experts);
  GenerateSummary summary = Summarise(config, params);
  DSV4_RETURN_IF_ERROR(WriteTensors(params, config, o, summary.tensors, summary.bytes));
  DSV4_RETURN_IF_ERROR(WriteTextFile(o.out_dir, "config.json", out_json));
  if (o.experts == ExpertFormat::kNvfp4) {
    DSV4_RETURN_IF_ERROR(WriteTextFile(o.out_dir, "hf_quant_config.json", quant_json));
  } else {
    // MXFP4 experts are the official format, which has no ModelOpt file: drop a stale one.
    std::error_code ec;
    std::filesystem::remove(o.out_dir + "/hf_quant_config.json", ec);
    if (ec) return absl::InternalError(absl::StrCat(o.out_dir, "/hf_quant_config.json: remove failed: ", ec.message()));
  }
  return summary;
}

}  // namespace dsv4::gen
