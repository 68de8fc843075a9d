// kV4 / kV5's wgmma tiles for MoeGroupedGemm (moe_gemm_wgmma.cu says how they work); called by
// moe_gemm.cu once it has checked g and chosen them.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/moe/moe.h"

namespace llm::cuda::moe_detail {

// One grouped GEMM on warpgroup-MMA tiles: bf16 / fp16 operands, or W8A8 (g.x_scale and
// g.w_scale set). tile_rows: the routing's tiles (MoeTileRows: 64 or 128), a CTA's rows; cols
// (128 or 256): its outputs.
void LaunchMoeGemmWgmma(const MoeGemm& g, const MoeRouting& r, int tile_rows, int cols,
                        cudaStream_t stream);

}  // namespace llm::cuda::moe_detail
