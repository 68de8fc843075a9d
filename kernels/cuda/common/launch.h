// Kernel launches with programmatic dependent launch (PDL, sm_90+).
//
// A chain of small kernels (the batch-1 decode step: ~10 kernels per layer) pays a drain and a
// ramp between every pair: kernel N+1's CTAs start only after kernel N's last CTA has exited.
// With PDL, kernel N+1 is launched while kernel N still runs; its threads may do work that does
// not depend on kernel N (a GEMV streams its weights into registers) and then block in
// PdlWait() until kernel N has completed and its writes are visible.
//
// The contract every kernel launched through Launch() keeps:
//   - PdlWait() runs in every thread before the thread reads anything an earlier kernel wrote
//     or writes anything an earlier kernel reads. Only immutable data (weights) may be touched
//     before it.
//   - PdlTrigger() may run anywhere (it only lets the next kernel start launching; its
//     PdlWait() still waits for this kernel's completion), so kernels call it early.
//   - One named exception to the first rule: the decode attention kernel (DecodeKernel in
//     attention/decode_attention.cu), with SetDecodeKvBeforeWait(true), reads the step's inputs
//     (context lengths, block tables) and the K/V rows of every key but each sequence's newest
//     before its wait, through L2 only (ld.global.cg, cp.async.cg: L1 is not coherent). Sound
//     because its predecessor P (the q|k|v GEMV with the KV append, or RopeAppendKv) writes none of
//     them but the newest rows, and launched it only after P's own PdlWait() returned: every kernel
//     before P had completed. Where P triggers before its wait (the ring GEMV, --gemv-ring), that
//     argument moves one kernel back: P's predecessor (an RMSNorm) waits first and writes none of
//     them either. Any new kernel placed before the decode attention must keep one of the two.
// Because each kernel completes only after its own PdlWait() returned, completion is ordered
// transitively along the stream; a kernel launched without the attribute (cuBLASLt, copies)
// is ordered as usual. Without the attribute (or below sm_90) both calls are no-ops, so the
// same kernels are exact either way (tests compare the two bit for bit).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda {

__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Process-wide switch (off by default): the CUDA executor turns it on on sm_90+ devices unless
// told not to (--no-pdl); kernel tests flip it to compare both paths.
inline std::atomic<bool>& ProgrammaticLaunchFlag() {
  static std::atomic<bool> enabled{false};
  return enabled;
}
inline void SetProgrammaticLaunch(bool on) { ProgrammaticLaunchFlag().store(on); }
inline bool ProgrammaticLaunch() {
  return ProgrammaticLaunchFlag().load(std::memory_order_relaxed);
}

// kernel<<<grid, block, smem, stream>>>(args...), with the PDL attribute when enabled. Works
// under stream capture (the graph keeps the programmatic edge).
template <typename... Params, typename... Args>
void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
            Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = ProgrammaticLaunch() ? 1 : 0;
  LLM_CUDA_CHECK(
      cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(std::forward<Args>(args))...));
}

// Tests only: one PDL kernel that waits for its predecessor, lets its successor launch, sleeps
// at least delay_ns, then copies `bytes` from src[i] to dst[i], i < count (dst and src: device
// arrays of device pointers; common/late_write.cu). The writes a successor reading before its
// PdlWait must not see.
void LateCopy(void* const* dst, const void* const* src, int count, int64_t bytes, uint32_t delay_ns,
              cudaStream_t stream);

}  // namespace llm::cuda
