// CudaOps (cuda_ops.h): each op forwards to its launcher and keeps the first error.
#include "kernels/cuda/cuda_ops.h"

#include <utility>

namespace dsv4::kernels::cuda {

void CudaOps::Keep(absl::Status s) {
  if (first_error_.ok() && !s.ok()) first_error_ = std::move(s);
}

absl::Status CudaOps::TakeError() { return std::exchange(first_error_, absl::OkStatus()); }

void CudaOps::Embed(const EmbedArgs& a) { Keep(LaunchEmbed(a, stream_)); }
void CudaOps::Linear(const LinearArgs& a) { Keep(LaunchLinear(a, stream_)); }
void CudaOps::FusedLinear(const FusedLinearArgs& a) { Keep(LaunchFusedLinear(a, stream_)); }
void CudaOps::RmsNorm(const RmsNormArgs& a) { Keep(LaunchRmsNorm(a, stream_)); }
void CudaOps::Rope(const RopeArgs& a) { Keep(LaunchRope(a, stream_)); }
void CudaOps::NormRope(const NormRopeArgs& a) { Keep(LaunchNormRope(a, stream_)); }
void CudaOps::HcPre(const HcPreArgs& a) { Keep(LaunchHcPre(a, stream_)); }
void CudaOps::HcPreNorm(const HcPreNormArgs& a) { Keep(LaunchHcPreNorm(a, stream_)); }
void CudaOps::HcPost(const HcPostArgs& a) { Keep(LaunchHcPost(a, stream_)); }
void CudaOps::HcHead(const HcHeadArgs& a) { Keep(LaunchHcHead(a, stream_)); }
void CudaOps::Scale(const ScaleArgs& a) { Keep(LaunchScale(a, stream_)); }
void CudaOps::KvWindowWrite(const KvWindowWriteArgs& a) { Keep(LaunchKvWindowWrite(a, stream_)); }
void CudaOps::Compressor(const CompressorArgs& a) { Keep(LaunchCompressor(a, stream_)); }
void CudaOps::Indexer(const IndexerArgs& a) { Keep(LaunchIndexer(a, scratch_->indexer, stream_)); }
void CudaOps::Attention(const AttentionArgs& a) { Keep(LaunchAttention(a, scratch_->attention, stream_)); }
void CudaOps::Moe(const MoeArgs& a) { Keep(LaunchMoe(a, scratch_->moe, stream_)); }
void CudaOps::HadamardFp4(const HadamardFp4Args& a) { Keep(LaunchHadamardFp4(a, stream_)); }
void CudaOps::Fill(const FillArgs& a) { Keep(LaunchFill(a, stream_)); }
void CudaOps::Sample(const SampleArgs& a) { Keep(LaunchSample(a, stream_)); }

}  // namespace dsv4::kernels::cuda
