// Fuzz target: config.json text through ParseConfig, then what the model loader does next with an accepted
// config (layer schedule lookups, DetectExpertFormat over the module names, the tensor inventory whose shapes the
// loader checks the checkpoint against). Accepted configs must give a schedule entry for every layer and tensor
// shapes whose element and byte counts fit in int64 (the loader multiplies them).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_check.h"
#include "fuzz/json_mutator.h"
#include "model/config/config.h"
#include "model/config/tensor_inventory.h"

namespace {

// Larger accepted configs are valid but slow to inventory (V4-Flash: 43 layers x 256 experts, 69k tensors);
// the fuzzer spends its time on small ones.
constexpr int64_t kMaxInventoryBlocks = 1024;

void CheckShape(const dsv4::TensorSpec& t) {
  int64_t n = 1;
  for (int64_t d : t.shape) {
    FUZZ_CHECK(d >= 0, "tensor %s has a negative dimension", t.name.c_str());
    FUZZ_CHECK(!__builtin_mul_overflow(n, d, &n), "tensor %s: element count overflows int64", t.name.c_str());
  }
  int64_t bytes = 0;
  FUZZ_CHECK(!__builtin_mul_overflow(n, static_cast<int64_t>(dsv4::ckpt::DTypeSize(t.dtype)), &bytes),
             "tensor %s: byte count overflows int64", t.name.c_str());
}

}  // namespace

DSV4_FUZZ_JSON_MUTATOR()

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = dsv4::ParseConfig(text);
  if (!config.ok()) {
    FUZZ_CHECK(config.status().code() == absl::StatusCode::kInvalidArgument, "unexpected code: %s",
               config.status().ToString().c_str());
    return 0;
  }
  const dsv4::Config& c = *config;
  FUZZ_CHECK(dsv4::ValidateConfig(c).ok(), "ParseConfig returned a config ValidateConfig refuses");
  const int64_t blocks = c.num_hidden_layers + c.num_nextn_predict_layers;
  FUZZ_CHECK(static_cast<int64_t>(c.compress_ratios.size()) == blocks, "schedule has %zu entries for %lld blocks",
             c.compress_ratios.size(), static_cast<long long>(blocks));
  for (int64_t l = 0; l < blocks; ++l) {
    const int r = c.CompressRatio(static_cast<int>(l));
    FUZZ_CHECK(r == 0 || r == 4 || r == 128, "layer %lld has ratio %d", static_cast<long long>(l), r);
  }
  if (c.n_routed_experts >= kMaxInventoryBlocks || blocks * (c.n_routed_experts + 1) > kMaxInventoryBlocks) return 0;
  auto experts = dsv4::DetectExpertFormat(c);
  for (const auto& t : dsv4::TensorInventory(c, experts.ok() ? *experts : dsv4::ExpertFormat::kMxfp4)) CheckShape(t);
  return 0;
}
