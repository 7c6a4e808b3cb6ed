// RoPE frequency tables per layer (dsv4-decode.md §2.3, §6.4): ratio-0 layers use plain rope_theta; compressed
// layers use compress_rope_theta with YaRN (floor/ceil correction range, no magnitude scaling) when
// rope_scaling is present, plain compress_rope_theta otherwise.
#pragma once

#include <vector>

#include "model/config/config.h"

namespace dsv4::model {

// inv_freq[i] for i < rope_dims / 2, computed in fp32 the way transformers does.
std::vector<float> PlainInvFreq(double theta, int rope_dims);
std::vector<float> YarnInvFreq(double theta, int rope_dims, const RopeScaling& scaling);
// The table a layer with this compress ratio uses.
std::vector<float> LayerInvFreq(const Config& config, int ratio);

}  // namespace dsv4::model
