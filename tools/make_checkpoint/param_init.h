// What values the checkpoint generator gives each parameter, chosen so that a forward pass through any
// number of layers keeps its activations O(1) (see param_init.cc for the per-kind reasoning).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "model/config/config.h"
#include "model/config/tensor_inventory.h"

namespace dsv4::gen {

// value[i] = offset + scale * u[i], u uniform on (-1, 1) (standard deviation 1/sqrt(3)).
struct Init {
  float offset = 0.0f;
  float scale = 0.0f;
};

// The affine map for a float parameter (every kind except kTid2Eid). `num_layers` is the depth the
// residual-stream scaling is computed for.
Init InitFor(const ParamSpec& param, int64_t num_layers);

// The fp32 values of a float parameter, shape-major (a linear's [N, K] row-major).
std::vector<float> FloatValues(const ParamSpec& param, int64_t num_layers, uint64_t seed);

// The on-disk bytes of a float parameter stored unquantised (BF16 / F32 plain tensors, BF16 linears).
// Values are generated straight into the output type (no fp32 staging), so a [129280, 4096]
// embedding costs its own size only.
std::vector<uint8_t> UnquantizedBytes(const ParamSpec& param, int64_t num_layers, uint64_t seed);

// The I64 little-endian bytes of a tid2eid parameter [V, K] over `experts` experts.
std::vector<uint8_t> Tid2EidBytes(const ParamSpec& param, int64_t experts, uint64_t seed);

// tid2eid [V, K]: row t holds K distinct expert ids in [0, E), drawn by a partial Fisher-Yates shuffle.
std::vector<int64_t> Tid2Eid(int64_t vocab, int64_t experts, int64_t per_token, uint64_t seed, std::string_view name);

}  // namespace dsv4::gen
