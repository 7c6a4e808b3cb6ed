// Shared set-up of the model tests: the tiny checkpoint (configs/tiny.json, seed 1, NVFP4 experts: the one
// the goldens in tests/data/golden were made from) generated once into a temp dir, and models loaded from it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/dsv4/model.h"

namespace dsv4::model::testing {

// Folder of the generated tiny checkpoint (created on first use, removed at exit).
const std::string& TinyCheckpoint();
// The CPU backend the test models run on (2 threads).
kernels::Backend& TestBackend();
// A model loaded from it (cached per mode).
Dsv4Model& TinyModel(NumericMode mode);
// The source tree (DSV4_SOURCE_DIR, set by ctest).
std::string SourceDir();
// Deterministic pseudo-random token ids in [2, vocab).
std::vector<int32_t> RandomTokens(int n, uint64_t seed, int vocab);

}  // namespace dsv4::model::testing
