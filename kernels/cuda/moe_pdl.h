// The MoE family's kernels use the backend's PDL helpers (pdl.h): the routed chain (logits -> select -> up GEMM ->
// down GEMM -> combine) is launched with programmatic stream serialization and every kernel of it waits for its
// predecessor before touching memory.
#pragma once

#include "kernels/cuda/pdl.h"

namespace dsv4::kernels::cuda::moe {

using ::dsv4::kernels::cuda::LaunchPdl;
#if defined(__CUDACC__)
using ::dsv4::kernels::cuda::GridDepLaunch;
using ::dsv4::kernels::cuda::GridDepWait;
#endif

}  // namespace dsv4::kernels::cuda::moe
