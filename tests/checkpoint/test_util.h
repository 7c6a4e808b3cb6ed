// Helpers shared by the checkpoint tests: temp folders, raw safetensors bytes, fresh random data.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dsv4::ckpt::testing {

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return absl::StrCat(path_, "/", name); }

 private:
  std::string path_;
};

// 8-byte little-endian length of `header` + `header` + `data`: a safetensors file as any writer
// lays it out (the header is used verbatim, so tests control padding and key order).
std::string RawSafetensors(const std::string& header, const std::string& data);
// `header` padded with spaces to a multiple of 8, as the reference writer does.
std::string PadHeader(std::string header);

void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);

// A generator seeded from std::random_device; the seed is printed so a failure can be replayed
// by setting DSV4_TEST_SEED.
std::mt19937_64 FreshRng();

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n);

// ||a - b|| / ||b|| (Frobenius); +inf if any element of either is NaN/Inf or sizes differ.
double RelErrorByNorm(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace dsv4::ckpt::testing
