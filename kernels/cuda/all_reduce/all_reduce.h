// A one-shot all-reduce (sum) of fp32 buffers over the GPUs of one process, through peer access
// (NVLink): tensor parallelism's residual-stream all-reduce of small steps, where NCCL's
// latency (~16 µs per call measured on an H200 pair, 2 per layer) dominates batch-1 decode.
//
// Every rank runs the kernel on its own buffer; CTA b of every rank owns the same slice of
// the elements. It copies its slice into this call's staging buffer (two, alternating by
// call), signals the peers' CTA b, waits for theirs (one barrier), sums the slice of every
// rank's staging buffer over ranks 0..N-1 in that order (so every rank gets bit-identical
// sums) and writes the sums in place. A rank reuses a staging buffer two calls later, after
// the next call's barrier, which every peer passes only after it finished reading it. The
// barrier counts epochs kept on the device (one per CTA), so the kernel replays inside CUDA
// graphs. Buffers at most kP2PAllReduceMaxElements; larger steps take NCCL.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

namespace llm::cuda {

constexpr int kP2PMaxRanks = 8;
constexpr int kP2PBlocks = 32;  // at most; fewer for small buffers
constexpr int kP2PThreads = 256;
constexpr int64_t kP2PAllReduceMaxElements = int64_t{1} << 18;  // 64 tokens × 4096
// Up to here the one-shot kernel beats NCCL's all-reduce (bench_all_reduce_gpu, H200 pair,
// 2026-11-29, graphs of 64 calls: 4.3 vs 6.5 µs at 16 KiB, 5.5 vs 7.1 µs at 128 KiB; at 1 MiB
// NCCL wins, 12.5 vs 14.3 µs); the executor takes NCCL above it.
constexpr int64_t kP2PFasterThanNccl = int64_t{1} << 15;  // 8 tokens × 4096

struct P2PAllReduceArgs {
  int world = 0, rank = 0;
  float* buf = nullptr;  // this rank's buffer
  // Every rank's staging: [2][kP2PAllReduceMaxElements] fp32 (P2PStagingBytes()).
  float* staging[kP2PMaxRanks] = {};
  // Every rank's flags: [kP2PBlocks][kP2PMaxRanks] uint32, zeroed once.
  uint32_t* flags[kP2PMaxRanks] = {};
  uint32_t* epochs = nullptr;  // this rank's [kP2PBlocks], zeroed once
  // A host-mapped word every rank shares: once AbortP2PAllReduce sets it, a CTA waiting at
  // the barrier for a rank that will never come gives up (its sums are garbage), so a failed
  // rank cannot leave the others' streams spinning forever.
  const volatile uint32_t* abort = nullptr;
};

// Bytes of staging, flags and epochs one rank allocates (flags and epochs zeroed).
constexpr size_t P2PStagingBytes() { return size_t{2} * kP2PAllReduceMaxElements * 4; }
constexpr size_t P2PFlagBytes() { return size_t{kP2PBlocks} * kP2PMaxRanks * 4; }
constexpr size_t P2PEpochBytes() { return size_t{kP2PBlocks} * 4; }

// Enables peer access between GPUs 0..world-1 and allocates every rank's staging, flags and
// epochs on its GPU: rank r's arguments are [r] (each sets .buf to its own buffer). Returns
// an empty vector, allocating nothing, when a pair of GPUs has no peer access or world is
// outside [2, kP2PMaxRanks]. The caller's current device is kept.
std::vector<P2PAllReduceArgs> CreateP2PAllReduce(int world);
// Frees what CreateP2PAllReduce allocated (after every launch using it has completed).
void DestroyP2PAllReduce(std::vector<P2PAllReduceArgs>& ranks);
// Makes every launch of this group, running or to come, give up waiting at its barrier.
void AbortP2PAllReduce(const std::vector<P2PAllReduceArgs>& ranks);

// buf[0, count) = Σ_r (rank r's buf)[0, count), on every rank (each calls it with its args on
// its own stream; all ranks must call it the same number of times). count % 4 == 0.
void P2PAllReduce(const P2PAllReduceArgs& a, int64_t count, cudaStream_t stream);

}  // namespace llm::cuda
