// A one-shot all-reduce (sum) of fp32 buffers over the GPUs of one process, through peer access
// (NVLink): tensor parallelism's residual-stream all-reduce of small steps, where NCCL's
// latency (~16 µs per call measured on an H200 pair, 2 per layer) dominates batch-1 decode.
//
// Every rank runs the kernel on its own buffer; CTA b of every rank owns the same slice of
// the elements. It signals the peers' CTA b that its buffer is ready, waits for theirs, sums
// the slice over ranks 0..N-1 in that order (so every rank gets bit-identical sums), signals
// that it has read, waits until the peers have read its slice, and writes the sums in place.
// The barriers count epochs kept on the device (one per CTA), so the kernel replays inside
// CUDA graphs. Buffers at most kP2PAllReduceMaxElements; larger steps take NCCL.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace llm::cuda {

constexpr int kP2PMaxRanks = 8;
constexpr int kP2PBlocks = 32;
constexpr int kP2PThreads = 512;
constexpr int64_t kP2PAllReduceMaxElements = int64_t{kP2PBlocks} * kP2PThreads * 16;

struct P2PAllReduceArgs {
  int world = 0, rank = 0;
  float* bufs[kP2PMaxRanks] = {};  // every rank's buffer (bufs[rank] is this rank's)
  // Every rank's flags: [2 barriers][kP2PBlocks][kP2PMaxRanks] uint32, zeroed once.
  uint32_t* flags[kP2PMaxRanks] = {};
  uint32_t* epochs = nullptr;  // this rank's [kP2PBlocks], zeroed once
};

// Bytes of flags and epochs one rank allocates (zeroed) for P2PAllReduceArgs.
constexpr size_t P2PFlagBytes() { return size_t{2} * kP2PBlocks * kP2PMaxRanks * 4; }
constexpr size_t P2PEpochBytes() { return size_t{kP2PBlocks} * 4; }

// bufs[rank][0, count) = Σ_r bufs[r][0, count), on every rank (each calls it with its args on
// its own stream; all ranks must call it the same number of times). count % 4 == 0.
void P2PAllReduce(const P2PAllReduceArgs& a, int64_t count, cudaStream_t stream);

}  // namespace llm::cuda
