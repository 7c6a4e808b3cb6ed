// cuBLASLt loaded with dlopen for dsv4-gemm-bench's peer columns: see lt_peer.h.
#include "bench/gemm/lt_peer.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dsv4::bench {
namespace {

// Where libcublasLt.so.13 may be: an explicit path, the loader's search path, the CUDA toolkit, PyTorch's wheels.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("DSV4_CUBLASLT"); env != nullptr && *env != '\0') out.emplace_back(env);
  out.emplace_back("libcublasLt.so.13");
  out.emplace_back("/usr/local/cuda/lib64/libcublasLt.so.13");
  out.emplace_back("/usr/local/cuda/targets/x86_64-linux/lib/libcublasLt.so.13");
  for (const char* pattern : {"/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libcublasLt.so.13",
                              "/usr/local/lib/python3*/dist-packages/nvidia/*/lib/libcublasLt.so.13",
                              "/usr/lib/python3/dist-packages/nvidia/*/lib/libcublasLt.so.13"}) {
    glob_t g{};
    if (glob(pattern, 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
    }
    globfree(&g);
  }
  return out;
}

absl::Status LtStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, ": status ", static_cast<int>(s)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CublasLt>> CublasLt::Load(void* workspace, size_t workspace_bytes) {
  std::unique_ptr<CublasLt> lt(new CublasLt());
  std::string tried;
  std::string path;
  for (const std::string& c : Candidates()) {
    lt->lib_ = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lt->lib_ != nullptr) {
      path = c;
      break;
    }
    absl::StrAppend(&tried, tried.empty() ? "" : ", ", c);
  }
  if (lt->lib_ == nullptr) return absl::NotFoundError(absl::StrCat("libcublasLt.so.13 not found (tried ", tried, ")"));
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lt->lib_, name));
    return fn != nullptr;
  };
  if (!sym(lt->create_, "cublasLtCreate") || !sym(lt->destroy_, "cublasLtDestroy") ||
      !sym(lt->version_, "cublasLtGetVersion") || !sym(lt->desc_create_, "cublasLtMatmulDescCreate") ||
      !sym(lt->desc_destroy_, "cublasLtMatmulDescDestroy") ||
      !sym(lt->desc_set_, "cublasLtMatmulDescSetAttribute") ||
      !sym(lt->layout_create_, "cublasLtMatrixLayoutCreate") ||
      !sym(lt->layout_destroy_, "cublasLtMatrixLayoutDestroy") ||
      !sym(lt->pref_create_, "cublasLtMatmulPreferenceCreate") ||
      !sym(lt->pref_destroy_, "cublasLtMatmulPreferenceDestroy") ||
      !sym(lt->pref_set_, "cublasLtMatmulPreferenceSetAttribute") ||
      !sym(lt->heuristic_, "cublasLtMatmulAlgoGetHeuristic") || !sym(lt->matmul_, "cublasLtMatmul")) {
    return absl::NotFoundError(absl::StrCat(path, " lacks a cuBLASLt entry point"));
  }
  if (absl::Status s = LtStatus(lt->create_(&lt->handle_), "create"); !s.ok()) return s;
  lt->workspace_ = workspace;
  lt->workspace_bytes_ = workspace_bytes;
  lt->description_ = absl::StrCat("cuBLASLt ", lt->version_(), " (", path, ")");
  return lt;
}

CublasLt::~CublasLt() {
  if (handle_ != nullptr) destroy_(handle_);
  if (lib_ != nullptr) dlclose(lib_);
}

void CublasLt::Destroy(Gemm& g) const {
  if (g.a != nullptr) layout_destroy_(g.a);
  if (g.b != nullptr) layout_destroy_(g.b);
  if (g.d != nullptr) layout_destroy_(g.d);
  if (g.desc != nullptr) desc_destroy_(g.desc);
  g = Gemm{};
}

absl::StatusOr<std::shared_ptr<CublasLt::Gemm>> CublasLt::Prepare(cudaDataType_t ab_type, cudaDataType_t d_type,
                                                                 int64_t m, int64_t n, int64_t k, int64_t lda,
                                                                 int64_t ldb, int64_t ldd, const float* a_scale,
                                                                 const float* b_scale) {
  std::shared_ptr<Gemm> g(new Gemm(), [this](Gemm* p) {
    Destroy(*p);
    delete p;
  });
  g->d_type = d_type;
  if (absl::Status s = LtStatus(desc_create_(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"); !s.ok()) return s;
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  absl::Status s = LtStatus(desc_set_(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)), "transa");
  if (s.ok()) s = LtStatus(desc_set_(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)), "transb");
  if (s.ok() && a_scale != nullptr) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    s = LtStatus(desc_set_(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof(mode)), "A scale mode");
    if (s.ok()) s = LtStatus(desc_set_(g->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)),
                             "A scale");
  }
  if (s.ok() && b_scale != nullptr) {
    const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    s = LtStatus(desc_set_(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof(mode)), "B scale mode");
    if (s.ok()) s = LtStatus(desc_set_(g->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)),
                             "B scale");
  }
  if (s.ok()) s = LtStatus(layout_create_(&g->a, ab_type, static_cast<uint64_t>(k), static_cast<uint64_t>(m), lda), "A");
  if (s.ok()) s = LtStatus(layout_create_(&g->b, ab_type, static_cast<uint64_t>(k), static_cast<uint64_t>(n), ldb), "B");
  if (s.ok()) s = LtStatus(layout_create_(&g->d, d_type, static_cast<uint64_t>(m), static_cast<uint64_t>(n), ldd), "D");
  if (!s.ok()) return s;
  cublasLtMatmulPreference_t pref = nullptr;
  if (s = LtStatus(pref_create_(&pref), "preference"); !s.ok()) return s;
  const uint64_t ws = workspace_bytes_;
  s = LtStatus(pref_set_(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)), "workspace");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (s.ok()) s = LtStatus(heuristic_(handle_, g->desc, g->a, g->b, g->d, g->d, pref, 1, &result, &found), "heuristic");
  pref_destroy_(pref);
  if (!s.ok()) return s;
  if (found == 0) return absl::UnimplementedError("cuBLASLt offers no algorithm");
  g->algo = result.algo;
  return g;
}

absl::StatusOr<std::shared_ptr<CublasLt::Gemm>> CublasLt::PrepareFp8(int64_t m, int64_t n, int64_t k, int64_t lda,
                                                                    int64_t ldb, int64_t ldd, const float* a_scale,
                                                                    const float* b_scale) {
  absl::StatusOr<std::shared_ptr<Gemm>> g =
      Prepare(CUDA_R_8F_E4M3, CUDA_R_32F, m, n, k, lda, ldb, ldd, a_scale, b_scale);
  if (g.ok()) return g;
  // Block-scaled FP8 may only come with a 16-bit D.
  absl::StatusOr<std::shared_ptr<Gemm>> bf16 =
      Prepare(CUDA_R_8F_E4M3, CUDA_R_16BF, m, n, k, lda, ldb, ldd, a_scale, b_scale);
  if (bf16.ok()) return bf16;
  return absl::Status(g.status().code(), absl::StrCat("f32 D: ", g.status().message(), "; bf16 D: ",
                                                      bf16.status().message()));
}

absl::StatusOr<std::shared_ptr<CublasLt::Gemm>> CublasLt::PrepareBf16(int64_t m, int64_t n, int64_t k, int64_t lda,
                                                                     int64_t ldb, int64_t ldd) {
  return Prepare(CUDA_R_16BF, CUDA_R_32F, m, n, k, lda, ldb, ldd, nullptr, nullptr);
}

absl::Status CublasLt::Run(const Gemm& g, const void* a, const void* b, void* d, cudaStream_t stream) const {
  const float alpha = 1.f, beta = 0.f;
  return LtStatus(matmul_(handle_, g.desc, &alpha, a, g.a, b, g.b, &beta, d, g.d, d, g.d, &g.algo, workspace_,
                          workspace_bytes_, stream),
                  "matmul");
}

}  // namespace dsv4::bench
