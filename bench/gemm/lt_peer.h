// cuBLASLt as the peer that dsv4-gemm-bench times beside the CUDA backend's linear, loaded at run time (dlopen):
//   - block-scaled FP8: both operands e4m3, the weight with its 128x128 f32 block scales (BLK128x128_32F), the
//     activations quantised per token and 128-element block (VEC128_32F) - cuBLASLt has no FP8 x bf16 mode;
//   - bf16 x bf16 -> f32 on weights dequantised to bf16 (twice the bytes of FP8).
// dlopen keeps the ~540 MB library out of the build's link line and out of the GPU bundle (the GPU machine has
// it in its CUDA toolkit and in PyTorch's wheels); without it the bench prints the peers as unavailable.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dsv4::bench {

class CublasLt {
 public:
  // Opens libcublasLt (DSV4_CUBLASLT, the loader's path, the CUDA toolkit, Python wheels), creates a handle.
  static absl::StatusOr<std::unique_ptr<CublasLt>> Load(void* workspace, size_t workspace_bytes);
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  std::string description() const { return description_; }

  // D [m, n] (column-major, ld ldd) = op(A) B with A stored [k, m] (ld lda, transposed: a row-major [m, k]
  // weight) and B [k, n] (ld ldb: n row-major tokens of k). The algorithm is cuBLASLt's first heuristic pick.
  struct Gemm {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    cudaDataType_t d_type = CUDA_R_32F;
  };
  // FP8: a_scale [ceil(m/128), ceil(k/128)] row-major f32 (the weight's block scales), b_scale the activation
  // scales (VEC128_32F, ceil(k/128) per token; their layout is the caller's). D f32 when cuBLASLt offers an
  // algorithm for it, else bf16 (see Gemm::d_type).
  absl::StatusOr<std::shared_ptr<Gemm>> PrepareFp8(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                                   int64_t ldd, const float* a_scale, const float* b_scale);
  // bf16 A and B, f32 D.
  absl::StatusOr<std::shared_ptr<Gemm>> PrepareBf16(int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb,
                                                    int64_t ldd);
  // Enqueues one product (graph-capturable: no allocation, the workspace is fixed).
  absl::Status Run(const Gemm& g, const void* a, const void* b, void* d, cudaStream_t stream) const;

 private:
  CublasLt() = default;
  absl::StatusOr<std::shared_ptr<Gemm>> Prepare(cudaDataType_t ab_type, cudaDataType_t d_type, int64_t m, int64_t n,
                                                int64_t k, int64_t lda, int64_t ldb, int64_t ldd,
                                                const float* a_scale, const float* b_scale);
  void Destroy(Gemm& g) const;

  void* lib_ = nullptr;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::string description_;
  // Entry points (dlsym).
  decltype(&cublasLtCreate) create_ = nullptr;
  decltype(&cublasLtDestroy) destroy_ = nullptr;
  decltype(&cublasLtGetVersion) version_ = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create_ = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy_ = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set_ = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create_ = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy_ = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create_ = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy_ = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set_ = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic_ = nullptr;
  decltype(&cublasLtMatmul) matmul_ = nullptr;
};

}  // namespace dsv4::bench
