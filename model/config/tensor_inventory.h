// The complete list of tensors a DeepSeek-V4 checkpoint holds for a Config: the one source of truth
// for the checkpoint generator (tools/make_checkpoint) and for loaders that validate a checkpoint.
//
// Names are the official un-prefixed ones (dsv4-decode.md section 4.1; cross-checked against RTP-LLM's
// dsv4_checkpoint_inventory: V4-Flash with MXFP4 experts has 69,187 tensors). Formats (section 4.2/4.3):
//   block FP8  X.weight F8_E4M3 [N,K] + X.scale F8_E8M0 [N/128, K/128]   attention, indexer wq_b, shared
//                                                                       experts, MTP e_proj/h_proj
//   NVFP4      X.weight U8 [N,K/2] + X.weight_scale F8_E4M3 [N,K/16] + X.weight_scale_2 F32 [] +
//              X.input_scale F32 []                                   routed experts of main layers
//                                                                       (ExpertFormat::kNvfp4)
//   MXFP4      X.weight I8 [N,K/2] + X.scale F8_E8M0 [N,K/32]         routed experts with kMxfp4, and
//                                                                       always for MTP layers' experts
//   BF16       embed, head, norms, router gate.weight, compressor wkv/wgate, indexer weights_proj
//   F32        hc_* parameters, attn_sink, compressor ape, gate.bias;   I64: gate.tid2eid (hash layers)
// Shape letters: D hidden, V vocab, H heads, Dh head_dim, E experts, K experts per token, I expert width.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "model/checkpoint/dtype.h"
#include "model/checkpoint/weight_formats.h"
#include "model/config/config.h"

namespace dsv4 {

// Storage of the routed experts of the main layers.
enum class ExpertFormat { kNvfp4, kMxfp4 };
std::string_view ExpertFormatName(ExpertFormat format);  // "nvfp4", "mxfp4"
absl::StatusOr<ExpertFormat> ParseExpertFormat(std::string_view name);

// What a parameter is for (the generator picks its magnitudes by it; loaders may ignore it).
enum class ParamKind {
  kEmbedding,       // embed.weight [V, D]
  kLinear,          // any projection whose output is normed or mixed further
  kResidualLinear,  // projections that write into the residual stream: attn.wo_b, experts' and shared w2
  kRouter,          // ffn.gate.weight [E, D]
  kNorm,            // RMSNorm weights
  kHcFn,            // hc_{attn,ffn}_fn [(2+hc)hc, hc*D], hc_head_fn [hc, hc*D]
  kHcBase,          // hc_*_base
  kHcScale,         // hc_*_scale [3] or [1]
  kAttnSink,        // attn.attn_sink [H]
  kApe,             // compressor ape [ratio, c*d]
  kRouterBias,      // ffn.gate.bias [E]
  kTid2Eid,         // ffn.gate.tid2eid [V, K]: K distinct expert ids per token
};
std::string_view ParamKindName(ParamKind kind);

// One logical parameter: a linear (possibly several tensors) or a plain tensor.
struct ParamSpec {
  // Linears: the module name without ".weight" ("layers.3.attn.wq_a"); plain tensors: the tensor name.
  std::string name;
  ParamKind kind = ParamKind::kLinear;
  bool linear = false;
  // Linears: the storage format. Plain tensors: kBF16 or kF32 (kTid2Eid: unused, see dtype).
  ckpt::WeightFormat format = ckpt::WeightFormat::kBF16;
  ckpt::DType dtype = ckpt::DType::kBF16;  // plain tensors: the on-disk dtype
  std::vector<int64_t> shape;              // linears: logical [N, K]; plain tensors: the tensor shape
  int layer = -1;                          // main layer l, num_hidden_layers + i for mtp.i, -1 global
};

// What a tensor is inside its parameter.
enum class TensorRole { kPlain, kWeight, kScale, kWeightScale, kWeightScale2, kInputScale };

struct TensorSpec {
  std::string name;  // checkpoint name
  ckpt::DType dtype = ckpt::DType::kBF16;
  std::vector<int64_t> shape;  // on disk; [] is a scalar
  ckpt::WeightFormat format = ckpt::WeightFormat::kBF16;  // format of the owning parameter
  TensorRole role = TensorRole::kPlain;
  std::string param;  // ParamSpec::name of the owner
  int layer = -1;

  int64_t numel() const;
  int64_t nbytes() const;
};

// Every parameter of the checkpoint, globals first, then main layers, then MTP layers. `config` must
// have passed ValidateConfig.
std::vector<ParamSpec> ParamInventory(const Config& config, ExpertFormat experts);

// The tensors one parameter is stored as (1 to 4), in the order weight, scale(s).
std::vector<TensorSpec> TensorsOf(const ParamSpec& param);

// Every tensor of the checkpoint: TensorsOf over ParamInventory.
std::vector<TensorSpec> TensorInventory(const Config& config, ExpertFormat experts);

// Expert format a loaded Config declares: kNvfp4 when hf_quant marks every routed-expert linear of the
// main layers NVFP4, kMxfp4 when there is no ModelOpt metadata or it marks none. Refuses a partial
// marking and NVFP4 on any other linear (MTP experts included), naming the first offending module.
absl::StatusOr<ExpertFormat> DetectExpertFormat(const Config& config);

// The ModelOpt metadata of a checkpoint whose main-layer routed experts are NVFP4 (dsv4-decode.md 4.3):
// MIXED_PRECISION, one quantized_layers entry per expert linear, the official exclude list.
QuantConfig Nvfp4ExpertsQuantConfig(const Config& config);

}  // namespace dsv4
