// LLM_HOST_DEVICE marks small inline functions shared by CPU code and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define LLM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define LLM_HOST_DEVICE inline
#endif
