// Weights at the backend seam: a WeightView names a linear weight's checkpoint format over host bytes (the
// mmap'd checkpoint or a loader's shard copy); Backend::PrepareLinear / PrepareExperts turn views into
// handles the model holds for its lifetime. The model never sees the prepared layout: the CPU backend
// dequantises to fp32 (it is the reference), the CUDA backend keeps the checkpoint format in device memory
// (repacked for its kernels) and dequantises only in registers.
//
// Formats (W [N, Kin] row-major, N = out features, Kin = in features; block scales run along Kin):
//   kF32 / kBF16    data [N, Kin]
//   kFp8Block128    data e4m3 [N, Kin]; scale [ceil(N/128), ceil(Kin/128)] as ue8m0 bytes (scale_f32 false)
//                   or f32 (scale_f32 true):  W[n,k] = e4m3(w[n,k]) * s[n/128, k/128]
//   kNvfp4          data [N, Kin/2] (byte j: low nibble = element 2j); scale e4m3 [N, Kin/16];
//                   global_scale f32:          W[n,k] = e2m1(c[n,k]) * e4m3(s[n, k/16]) * global_scale
//   kMxfp4          data [N, Kin/2] (same nibbles); scale ue8m0 [N, Kin/32]: W[n,k] = e2m1(c[n,k]) * 2^(s-127)
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace dsv4::kernels {

enum class WeightFormat { kF32, kBF16, kFp8Block128, kNvfp4, kMxfp4 };

// "F32", "BF16", "FP8_BLOCK128", "NVFP4", "MXFP4".
const char* WeightFormatName(WeightFormat format);

// A linear weight in its checkpoint format, over host memory that lives until Prepare* returns.
struct WeightView {
  std::string name;                  // for error messages ("layers.3.attn.wq_a")
  WeightFormat format = WeightFormat::kF32;
  int64_t n = 0, k = 0;              // N, Kin
  const uint8_t* data = nullptr;     // see the table above
  const uint8_t* scale = nullptr;    // block scales; null for kF32 / kBF16
  bool scale_f32 = false;            // kFp8Block128: scales stored as f32 instead of ue8m0
  float global_scale = 1.f;          // kNvfp4: weight_scale_2
};

// A prepared linear weight. Backends derive their own representation from it; ops static_cast to it.
class LinearWeight {
 public:
  virtual ~LinearWeight() = default;
  int64_t n() const { return n_; }
  int64_t k() const { return k_; }
  WeightFormat format() const { return format_; }  // the checkpoint format it was prepared from
  int64_t device_bytes() const { return bytes_; }  // backend memory it holds

 protected:
  LinearWeight(int64_t n, int64_t k, WeightFormat format, int64_t bytes)
      : n_(n), k_(k), format_(format), bytes_(bytes) {}

 private:
  int64_t n_, k_;
  WeightFormat format_;
  int64_t bytes_;
};
using LinearHandle = std::unique_ptr<LinearWeight>;

// The routed experts of one MoE layer as one prepared object (a device kernel wants them in one table):
// E experts of w1/w3 [I, D] and w2 [D, I]; an expert this rank does not hold has no weights.
class ExpertWeights {
 public:
  virtual ~ExpertWeights() = default;
  int64_t experts() const { return experts_; }  // E (all of the model's, held or not)
  int64_t inter() const { return inter_; }      // I
  int64_t dim() const { return dim_; }          // D
  virtual bool Holds(int64_t e) const = 0;
  int64_t device_bytes() const { return bytes_; }

 protected:
  ExpertWeights(int64_t experts, int64_t inter, int64_t dim, int64_t bytes)
      : experts_(experts), inter_(inter), dim_(dim), bytes_(bytes) {}

 private:
  int64_t experts_, inter_, dim_, bytes_;
};
using ExpertsHandle = std::unique_ptr<ExpertWeights>;

}  // namespace dsv4::kernels
