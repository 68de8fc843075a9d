// kV4's wgmma tiles for MoeGroupedGemm (moe_gemm_wgmma.cu says how they work); called by
// moe_gemm.cu once it has checked g and chosen them.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/moe/moe.h"

namespace llm::cuda::moe_detail {

// One grouped GEMM on warpgroup-MMA tiles: bf16 / fp16 operands, or W8A8 (g.x_scale and
// g.w_scale set); warpgroups (1 or 2) side by side along n per CTA, 64 rows x 128 outputs each.
void LaunchMoeGemmWgmma(const MoeGemm& g, const MoeRouting& r, int warpgroups, cudaStream_t stream);

}  // namespace llm::cuda::moe_detail
