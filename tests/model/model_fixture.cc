// Shared set-up of the model tests: see model_fixture.h.
#include "tests/model/model_fixture.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tools/make_checkpoint/generator.h"

namespace dsv4::model::testing {

std::string SourceDir() {
  const char* s = std::getenv("DSV4_SOURCE_DIR");
  return s ? s : DSV4_TEST_SOURCE_DIR;
}

namespace {

struct TempCheckpoint {
  std::string dir;
  TempCheckpoint() {
    dir = (std::filesystem::temp_directory_path() / ("dsv4_model_test_" + std::to_string(::getpid()))).string();
    std::ifstream in(SourceDir() + "/configs/tiny.json");
    std::stringstream json;
    json << in.rdbuf();
    gen::GeneratorOptions o{.seed = 1, .out_dir = dir, .overwrite = true};
    auto summary = gen::GenerateCheckpoint(json.str(), o);
    if (!summary.ok()) {
      ADD_FAILURE() << "generating the tiny checkpoint: " << summary.status();
      std::abort();
    }
  }
  ~TempCheckpoint() { std::filesystem::remove_all(dir); }
};

}  // namespace

const std::string& TinyCheckpoint() {
  static TempCheckpoint ckpt;
  return ckpt.dir;
}

kernels::Backend& TestBackend() {
  static std::unique_ptr<kernels::Backend> backend = kernels::cpu::MakeCpuBackend(2);
  return *backend;
}

Dsv4Model& TinyModel(NumericMode mode) {
  kernels::Backend& backend = TestBackend();  // constructed first so it outlives the cached models
  static std::map<NumericMode, std::unique_ptr<Dsv4Model>> models;
  auto& m = models[mode];
  if (!m) {
    auto loaded = Dsv4Model::Load(TinyCheckpoint(), {.mode = mode, .backend = &backend});
    if (!loaded.ok()) {
      ADD_FAILURE() << "loading the tiny model: " << loaded.status();
      std::abort();
    }
    m = std::move(*loaded);
  }
  return *m;
}

std::vector<int32_t> RandomTokens(int n, uint64_t seed, int vocab) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& v : t) v = 2 + static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab - 2));
  return t;
}

}  // namespace dsv4::model::testing
