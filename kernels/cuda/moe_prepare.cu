// PrepareCudaExperts: the routed experts of one layer into the device layout of moe_layout.h, once at load.
// The host validates each view (shapes, formats, scales: the CPU backend's rules) and copies the checkpoint
// bytes of one expert at a time into a device staging buffer; a repack kernel writes the expert's slot (codes
// in MMA-fragment order, scales re-encoded), so loading costs a copy per expert rather than a host pass over
// 138 GiB of nibbles.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/cuda/launchers.h"
#include "kernels/cuda/moe_internal.h"

namespace dsv4::kernels::cuda {
namespace moe {
namespace {

// One matrix of one expert for the repack kernel.
struct RepackMatrix {
  const uint8_t* codes = nullptr;   // [N, K/2] checkpoint bytes (low nibble = even column)
  const uint8_t* scales = nullptr;  // [N, K/16] e4m3 (NVFP4) or [N, K/32] ue8m0 (MXFP4)
  int64_t n = 0, k = 0;
  uint8_t* dst_codes = nullptr;     // the expert's w13 or w2 code tiles
  uint8_t* dst_scales = nullptr;    // the matching scale tiles
  int slot_in_pair = -1;            // 0 (w1) / 1 (w3): fixed slot of a w13 pair; -1 (w2): rg % 2
  int mx_shift = 0;                 // MXFP4: j subtracted from every ue8m0 byte
};
struct RepackArgs {
  RepackMatrix m[3];  // w1, w3, w2
};

// One thread per (tile, lane): the lane's 16 code bytes and its scale bytes (blockIdx.y picks the matrix).
template <Fp4Kind kKind>
__global__ void RepackKernel(RepackArgs args) {
  const RepackMatrix& m = args.m[blockIdx.y];
  const int64_t nkc = m.k / kChunkK;
  const int64_t gid = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (gid >= m.n / kTileRows * nkc * 32) return;
  const int lane = static_cast<int>(gid & 31);
  const int64_t tile = gid >> 5, rg = tile / nkc, kc = tile % nkc;
  const int g = lane >> 2, c = lane & 3;
  const int64_t pair = m.slot_in_pair >= 0 ? rg : rg / 2;
  const int64_t dst_tile = (pair * nkc + kc) * 2 + (m.slot_in_pair >= 0 ? m.slot_in_pair : rg % 2);
  const int64_t code_stride = m.k / 2;
  const int64_t scale_stride = m.k / (kKind == Fp4Kind::kNvfp4 ? 16 : 32);

  uint32_t words[4];
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = rg * kTileRows + g + 8 * (j & 1);
        const int64_t col = kc * kChunkK + 16 * c + 4 * s + 2 * (j >> 1) + h;
        uint32_t code = (m.codes[row * code_stride + col / 2] >> (4 * (col & 1))) & 15u;
        if constexpr (kKind == Fp4Kind::kNvfp4) {
          const uint8_t sc = m.scales[row * scale_stride + col / 16];
          if (sc & 0x80u) code ^= 8u;              // negative scale: flip the value instead
          if ((sc & 0x7fu) == 0) code = 0;         // zero scale: the whole block is zero
        } else if (m.scales[row * scale_stride + col / 32] < m.mx_shift) {
          code = 0;  // a scale 2^128 below the matrix's largest: flushed (see moe_layout.h)
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) w |= ((code >> b) & 1u) << Fp4WordBit(j, h, b);
      }
    }
    words[s] = w;
  }
  *reinterpret_cast<uint4*>(m.dst_codes + dst_tile * kTileBytes + lane * 16) =
      make_uint4(words[0], words[1], words[2], words[3]);

  const int64_t row0 = rg * kTileRows;
  if constexpr (kKind == Fp4Kind::kNvfp4) {
    const int64_t blk = kc * 4 + c;
    uint8_t* dst = m.dst_scales + dst_tile * kNvfp4ScaleTileBytes + 2 * lane;
    dst[0] = EncodeNvfp4Scale(m.scales[(row0 + g) * scale_stride + blk]);
    dst[1] = EncodeNvfp4Scale(m.scales[(row0 + g + 8) * scale_stride + blk]);
  } else if (lane < 16) {
    const int64_t blk = kc * 2 + lane / 8;
    const int gg = lane % 8;
    uint8_t* dst = m.dst_scales + dst_tile * kMxfp4ScaleTileBytes + 2 * lane;
    const int s0 = m.scales[(row0 + gg) * scale_stride + blk], s1 = m.scales[(row0 + gg + 8) * scale_stride + blk];
    dst[0] = static_cast<uint8_t>(s0 >= m.mx_shift ? s0 - m.mx_shift : 0);
    dst[1] = static_cast<uint8_t>(s1 >= m.mx_shift ? s1 - m.mx_shift : 0);
  }
}

int64_t CodeBytes(const WeightView& w) { return w.n * (w.k / 2); }
int64_t ScaleBytes(const WeightView& w) { return w.n * (w.k / (w.format == WeightFormat::kNvfp4 ? 16 : 32)); }

// Refuses NaN scales (as the CPU backend refuses weights that dequantise to NaN) and returns the fp32
// epilogue factor of the matrix and, for MXFP4, the exponent shift j of moe_layout.h.
absl::Status ScanScales(const WeightView& w, float* epilogue, int* mx_shift) {
  const int64_t n = ScaleBytes(w);
  if (w.format == WeightFormat::kNvfp4) {
    if (!(std::isfinite(w.global_scale) && w.global_scale > 0.f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(w.name, ": NVFP4 global scale must be finite and > 0, got ", w.global_scale));
    }
    for (int64_t i = 0; i < n; ++i) {
      if ((w.scale[i] & 0x7fu) == 0x7fu) {
        return absl::DataLossError(absl::StrCat(w.name, ": NVFP4 block scale [", i / (w.k / 16), ", ",
                                                i % (w.k / 16), "] is NaN (corrupt weight or scale)"));
      }
    }
    *epilogue = w.global_scale * kNvfp4EpilogueShift;
    *mx_shift = 0;
    return absl::OkStatus();
  }
  int smax = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (w.scale[i] == 0xffu) {
      return absl::DataLossError(absl::StrCat(w.name, ": MXFP4 block scale [", i / (w.k / 32), ", ", i % (w.k / 32),
                                              "] is NaN (corrupt weight or scale)"));
    }
    smax = std::max(smax, int{w.scale[i]});
  }
  *mx_shift = std::max(0, smax - 128);
  *epilogue = std::ldexp(1.f, *mx_shift);
  return absl::OkStatus();
}

absl::Status CheckView(const WeightView& w, WeightFormat format, int64_t n, int64_t k) {
  if (w.format != format) {
    return absl::InvalidArgumentError(absl::StrCat(w.name, ": routed experts must all be ", WeightFormatName(format),
                                                   " (NVFP4 or MXFP4), got ", WeightFormatName(w.format)));
  }
  if (w.n != n || w.k != k) {
    return absl::InvalidArgumentError(
        absl::StrCat(w.name, ": shape [", w.n, ", ", w.k, "], expected [", n, ", ", k, "]"));
  }
  if (w.scale == nullptr) return absl::InvalidArgumentError(absl::StrCat(w.name, ": FP4 weight has no scale"));
  return absl::OkStatus();
}

}  // namespace

CudaExperts::CudaExperts(int64_t experts, int64_t inter, int64_t dim, Fp4Kind kind, std::vector<int32_t> host_slot,
                         Buffer weights, Buffer tables)
    : ExpertWeights(experts, inter, dim, weights.bytes() + tables.bytes()),
      kind_(kind),
      layout_(MakeExpertLayout(kind, dim, inter)),
      host_slot_(std::move(host_slot)),
      weights_(std::move(weights)),
      tables_(std::move(tables)) {
  for (int32_t s : host_slot_) held_ += s >= 0;
}

}  // namespace moe

absl::StatusOr<ExpertsHandle> PrepareCudaExperts(std::span<const WeightView> w1, std::span<const WeightView> w3,
                                                 std::span<const WeightView> w2, Backend& backend) {
  using moe::Fp4Kind;
  const int64_t num_experts = static_cast<int64_t>(w1.size());
  if (num_experts == 0 || w3.size() != w1.size() || w2.size() != w1.size()) {
    return absl::InvalidArgumentError(absl::StrCat("experts: w1/w3/w2 must list the same E > 0 views, got ",
                                                   w1.size(), "/", w3.size(), "/", w2.size()));
  }
  // Which experts this rank holds, and the shapes and format they share.
  std::vector<int32_t> slot(num_experts, -1);
  int32_t slots = 0;
  int64_t first = -1;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int held = (w1[e].data != nullptr) + (w3[e].data != nullptr) + (w2[e].data != nullptr);
    if (held == 0) continue;
    if (held != 3) {
      return absl::InvalidArgumentError(
          absl::StrCat(w1[e].name, ": expert ", e, " has ", held, " of its 3 matrices (all or none)"));
    }
    if (first < 0) first = e;
    slot[e] = slots++;
  }
  const WeightView& ref = w1[first >= 0 ? first : 0];
  const int64_t inter = ref.n, dim = ref.k;
  const WeightFormat format = first >= 0 ? ref.format : WeightFormat::kNvfp4;
  if (format != WeightFormat::kNvfp4 && format != WeightFormat::kMxfp4) {
    return absl::InvalidArgumentError(absl::StrCat(ref.name, ": routed experts must be NVFP4 or MXFP4, got ",
                                                   WeightFormatName(format)));
  }
  if (inter <= 0 || dim <= 0 || inter % moe::kChunkK != 0 || dim % moe::kChunkK != 0) {
    return absl::InvalidArgumentError(absl::StrCat(ref.name, ": the CUDA MoE needs I and D multiples of ",
                                                   moe::kChunkK, ", got I = ", inter, ", D = ", dim));
  }
  for (int64_t e = 0; e < num_experts; ++e) {
    if (slot[e] < 0) continue;
    DSV4_RETURN_IF_ERROR(moe::CheckView(w1[e], format, inter, dim));
    DSV4_RETURN_IF_ERROR(moe::CheckView(w3[e], format, inter, dim));
    DSV4_RETURN_IF_ERROR(moe::CheckView(w2[e], format, dim, inter));
  }
  const Fp4Kind kind = format == WeightFormat::kNvfp4 ? Fp4Kind::kNvfp4 : Fp4Kind::kMxfp4;
  const moe::ExpertLayout layout = moe::MakeExpertLayout(kind, dim, inter);

  // Device memory: the slots, then the tables (expert_slot [E] int32, expert_scale [slots, 4] f32).
  DSV4_ASSIGN_OR_RETURN(Buffer weights, backend.Allocate(std::max<int64_t>(slots, 1) * layout.bytes,
                                                         MemoryKind::kWeights));
  const int64_t scale_off = moe::CudaExperts::TableScaleOffset(num_experts);
  std::vector<uint8_t> tables(scale_off + std::max<int64_t>(slots, 1) * 16, 0);
  std::memcpy(tables.data(), slot.data(), slot.size() * 4);
  float* expert_scale = reinterpret_cast<float*>(tables.data() + scale_off);

  if (slots > 0) {
    // Staging for one expert's checkpoint bytes: codes of w1, w3, w2, then their scales.
    const WeightView& r1 = w1[first];
    const WeightView& r2 = w2[first];
    const int64_t c13 = moe::CodeBytes(r1), c2 = moe::CodeBytes(r2);
    const int64_t s13 = moe::ScaleBytes(r1), s2 = moe::ScaleBytes(r2);
    const int64_t staging_bytes = 2 * c13 + c2 + 2 * s13 + s2;
    DSV4_ASSIGN_OR_RETURN(Buffer staging, backend.Allocate(staging_bytes, MemoryKind::kWorkspace));
    uint8_t* st = staging.as<uint8_t>();
    uint8_t* const src_codes[3] = {st, st + c13, st + 2 * c13};
    uint8_t* const src_scales[3] = {st + 2 * c13 + c2, st + 2 * c13 + c2 + s13, st + 2 * c13 + c2 + 2 * s13};
    const int64_t tiles = inter / moe::kTileRows * (dim / moe::kChunkK);
    const dim3 grid(static_cast<unsigned>((tiles * 32 + 255) / 256), 3);
    for (int64_t e = 0; e < num_experts; ++e) {
      if (slot[e] < 0) continue;
      const WeightView* views[3] = {&w1[e], &w3[e], &w2[e]};
      moe::RepackArgs args;
      uint8_t* dst = weights.as<uint8_t>() + slot[e] * layout.bytes;
      for (int i = 0; i < 3; ++i) {
        const WeightView& v = *views[i];
        int shift = 0;
        DSV4_RETURN_IF_ERROR(moe::ScanScales(v, &expert_scale[slot[e] * 4 + i], &shift));
        DSV4_RETURN_IF_ERROR(backend.CopyToDevice(src_codes[i], v.data, moe::CodeBytes(v)));
        DSV4_RETURN_IF_ERROR(backend.CopyToDevice(src_scales[i], v.scale, moe::ScaleBytes(v)));
        args.m[i] = {.codes = src_codes[i],
                     .scales = src_scales[i],
                     .n = v.n,
                     .k = v.k,
                     .dst_codes = dst + (i < 2 ? layout.w13_codes : layout.w2_codes),
                     .dst_scales = dst + (i < 2 ? layout.w13_scales : layout.w2_scales),
                     .slot_in_pair = i < 2 ? i : -1,
                     .mx_shift = shift};
      }
      // The copies ran on the backend's stream; the repack runs on the legacy stream after them, and the next
      // expert's copies wait for it (staging is reused).
      DSV4_RETURN_IF_ERROR(backend.Synchronize());
      if (kind == Fp4Kind::kNvfp4) {
        moe::RepackKernel<Fp4Kind::kNvfp4><<<grid, 256>>>(args);
      } else {
        moe::RepackKernel<Fp4Kind::kMxfp4><<<grid, 256>>>(args);
      }
      DSV4_RETURN_IF_ERROR(CudaStatus(cudaGetLastError(), "MoE expert repack launch"));
      DSV4_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(cudaStreamLegacy), "MoE expert repack"));
    }
  }
  DSV4_ASSIGN_OR_RETURN(Buffer table_buf, backend.Allocate(static_cast<int64_t>(tables.size()), MemoryKind::kWeights));
  DSV4_RETURN_IF_ERROR(backend.CopyToDevice(table_buf.data(), tables.data(), static_cast<int64_t>(tables.size())));
  DSV4_RETURN_IF_ERROR(backend.Synchronize());
  return std::make_unique<moe::CudaExperts>(num_experts, inter, dim, kind, std::move(slot), std::move(weights),
                                            std::move(table_buf));
}

}  // namespace dsv4::kernels::cuda
