// CudaOps: the Ops interface of the CUDA backend. Every call forwards to its family's launcher (launchers.h)
// on the backend's stream and keeps the first error (a refused argument or a failed launch) for
// Backend::Synchronize / CopyToHost; later calls still launch (the step's result is discarded anyway, and a
// graph capture sees every node). Owned by CudaBackend; used by the engine thread only.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/launchers.h"
#include "kernels/ops.h"

namespace dsv4::kernels::cuda {

// The scratch of the op families that need one, owned by the backend (sized by Backend::Reserve).
struct CudaScratchSet {
  CudaScratch moe;
  CudaScratch attention;
  CudaScratch indexer;
};

class CudaOps final : public Ops {
 public:
  // `scratch` must outlive the ops; its contents may change between steps (Reserve).
  CudaOps(cudaStream_t stream, const CudaScratchSet* scratch) : stream_(stream), scratch_(scratch) {}

  void Embed(const EmbedArgs& a) override;
  void Linear(const LinearArgs& a) override;
  void FusedLinear(const FusedLinearArgs& a) override;
  void RmsNorm(const RmsNormArgs& a) override;
  void Rope(const RopeArgs& a) override;
  void NormRope(const NormRopeArgs& a) override;
  void HcPre(const HcPreArgs& a) override;
  void HcPreNorm(const HcPreNormArgs& a) override;
  void HcPost(const HcPostArgs& a) override;
  void HcHead(const HcHeadArgs& a) override;
  void Scale(const ScaleArgs& a) override;
  void KvWindowWrite(const KvWindowWriteArgs& a) override;
  void Compressor(const CompressorArgs& a) override;
  void Indexer(const IndexerArgs& a) override;
  void Attention(const AttentionArgs& a) override;
  void Moe(const MoeArgs& a) override;
  void HadamardFp4(const HadamardFp4Args& a) override;
  void Fill(const FillArgs& a) override;
  void Sample(const SampleArgs& a) override;

  // The first error since the last call (OK if none), and forgets it.
  absl::Status TakeError();

 private:
  void Keep(absl::Status s);

  cudaStream_t stream_;
  const CudaScratchSet* scratch_;
  absl::Status first_error_;
};

}  // namespace dsv4::kernels::cuda
