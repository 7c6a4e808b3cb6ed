// Measures the achievable bf16 mma.sync m16n8k16 rate (FLOP/s) on the current GPU; 0 on a CUDA error.
// verbose prints each (warps per SM, chains per warp) point.
#pragma once

namespace dsv4::kernels::sparse_mla {

double MeasureMmaSyncPeak(bool verbose);

}  // namespace dsv4::kernels::sparse_mla
