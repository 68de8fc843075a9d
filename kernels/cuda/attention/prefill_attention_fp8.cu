// Prefill over FP8 (e4m3) KV caches on the Hopper rung: v4_wgmma reads a bf16 / fp16 copy of
// exactly the pages the batch's sequences use.
//
// v4_wgmma's operands come from shared memory through TMA, and its wgmma instructions take
// 16-bit operands on both sides (an e4m3 B needs an e4m3 A: Q and P would have to be quantized,
// which changes the result). So before it runs, one memory-bound pass (DequantizePagesKernel)
// copies every page of the batch's sequences (ceil((context + chunk) / block_size) per
// sequence) into a scratch pool of the attention dtype, exactly (every e4m3 value is an fp16
// and a bf16 value), and writes a block table over that scratch pool; then v4 runs on it
// unchanged, with k_scale folded into the softmax scale and v_scale into the output
// normalisation as for the rungs that read e4m3 directly (v1_naive, v3_mma). Same math as v3
// over the same codes, on the faster rung.
//
// Cost: the pass reads the sequences' e4m3 pages once and writes twice the bytes; the attention
// over them is O(keys × queries), so past a few hundred query rows the pass is noise (a 131k-key
// sequence: 268 MB read + 537 MB written per layer at head_dim 128 with 8 KV heads, ~0.2 ms,
// against ~16 ms of attention for an 8k chunk at that context). Scratch: the pages' bf16 bytes
// plus one table (PrefillFp8ScratchBytes); the engine sizes one for a maximum-length sequence
// and runs sequences whose pages do not fit together as several launches.
//
// Sliding window: the pages wholly left of the window of each chunk's first query are neither
// read nor written (their table entries are -1: v4 reads zeros there, masked), so a 32k context
// with a 4k window copies ~4k keys' pages; the scratch keeps its layout (sized as without).
// Scratch layout: [table: num_seqs × max_blocks_per_seq int32, 256-byte aligned] [K pages] [V
// pages], each page [num_kv_heads, block_size, head_dim] as in kernels/paged_kv.h; sequence s's
// pages are scratch pages base_s … base_s + n_s - 1 with base_s = n_0 + … + n_{s-1}.
// Test:  the kv_fp8*_gpu_test targets (ninja -C build <them>), then
//        (cd build && ctest -L gpu -R kv_fp8)   (PrefillFp8Gpu)
// Bench: ninja -C build bench_prefill_attention_gpu &&
//        ./build/bench_prefill_attention_gpu --kv fp8
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/vec.cuh"

namespace llm::cuda {
namespace {

constexpr size_t kAlign = 256;
constexpr int kDequantThreads = 256;

size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

size_t TableBytes(int64_t num_seqs, int64_t max_blocks_per_seq) {
  return AlignUp(size_t(num_seqs) * size_t(max_blocks_per_seq) * sizeof(int32_t));
}
size_t PageBytes(const PagedKvLayout& layout, DType dtype) {
  return size_t(layout.num_kv_heads) * size_t(layout.block_size) * size_t(layout.head_dim) *
         DTypeSize(dtype);
}

// Pages sequence s spans (its cached context and its chunk): one formula for the host's
// PrefillPagesNeeded and the copy kernel, which must agree.
__host__ __device__ __forceinline__ int SequencePages(const int32_t* cu_seqlens_q,
                                                      const int32_t* context_lens, int64_t s,
                                                      int block_size) {
  const int keys = context_lens[s] + cu_seqlens_q[s + 1] - cu_seqlens_q[s];
  return (keys + block_size - 1) / block_size;
}

struct DequantArgs {
  const uint8_t* k = nullptr;  // e4m3 pools [num_blocks, num_kv_heads, block_size, head_dim]
  const uint8_t* v = nullptr;
  void* k_out = nullptr;  // scratch pools, same layout, elements of the attention dtype
  void* v_out = nullptr;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, width]
  int32_t* tables_out = nullptr;          // [num_seqs, width] over the scratch pools
  int64_t width = 0;
  int64_t num_blocks = 0;  // of the e4m3 pools
  int64_t capacity = 0;    // scratch pages
  int64_t page_elems = 0;  // num_kv_heads · block_size · head_dim (a multiple of 8)
  int block_size = 0;
  int sliding_window = 0;  // pages wholly left of the chunk's first window are not copied
};

// Blocks blockIdx.x, blockIdx.x + gridDim.x, ... of sequence blockIdx.y: each one's scratch page
// index into the new table, and its K and V pages converted, 8 codes (one 8-byte load, one
// 16-byte store) per thread and step. gridDim.x covers the longest sequence of the batch when
// the caller knows it (max_num_keys) and the table width otherwise; the stride loop makes the
// copy complete either way.
template <typename T>
__global__ void __launch_bounds__(kDequantThreads) DequantizePagesKernel(DequantArgs d) {
  const int s = blockIdx.y;
  auto pages = [&](int i) {
    return SequencePages(d.cu_seqlens_q, d.context_lens, i, d.block_size);
  };
  const int n = pages(s);
  if (int(blockIdx.x) >= n) return;  // (the whole CTA)
  // base_s: the pages of the sequences before s, summed by the CTA.
  int64_t part = 0;
  for (int i = threadIdx.x; i < s; i += kDequantThreads) part += pages(i);
  for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
  __shared__ int64_t warp_sums[kDequantThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = part;
  __syncthreads();
  int64_t base = 0;
#pragma unroll
  for (int w = 0; w < kDequantThreads / 32; ++w) base += warp_sums[w];
  auto convert = [](uint2 codes) {
    uint32_t h[4];  // fp16 pairs of codes 0-1, 2-3, 4-5, 6-7
    vec::E4m3x4ToHalf2x2(codes.x, h[0], h[1]);
    vec::E4m3x4ToHalf2x2(codes.y, h[2], h[3]);
    if constexpr (std::is_same_v<T, __nv_bfloat16>) {  // fp16 -> fp32 -> bf16: exact
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __nv_bfloat162 x =
            __float22bfloat162_rn(__half22float2(reinterpret_cast<const __half2&>(h[i])));
        h[i] = reinterpret_cast<const uint32_t&>(x);
      }
    }
    return make_uint4(h[0], h[1], h[2], h[3]);
  };
  const int64_t chunks = d.page_elems / 8;
  // Sliding window: no query of the chunk sees a key left of its first query's window (the
  // query at position context_lens[s]), so those pages are not copied; their entries are -1
  // and v4, which still loads the pages of the window's first 128-key tile left of the window,
  // reads them as zeros (masked there).
  const int first_key = int(VisibleKeyBegin(d.context_lens[s], d.sliding_window));
  for (int b = blockIdx.x; b < n; b += gridDim.x) {
    const int64_t dst = base + b;
    if ((b + 1) * d.block_size <= first_key) {
      if (threadIdx.x == 0) d.tables_out[int64_t(s) * d.width + b] = -1;
      continue;
    }
    const int64_t src = d.block_tables[int64_t(s) * d.width + b];
    // The host sizes the scratch from the same lengths (PrefillPagesNeeded) and the engine's
    // tables hold valid blocks. A page that breaks either is never written out of bounds, and
    // its table entry becomes -1, so v4 reads it as zeros (TMA fills out-of-range boxes), never
    // as another sequence's page left in the table by an earlier launch.
    if (dst >= d.capacity || src < 0 || src >= d.num_blocks) {
      if (threadIdx.x == 0) d.tables_out[int64_t(s) * d.width + b] = -1;
      continue;
    }
    if (threadIdx.x == 0) d.tables_out[int64_t(s) * d.width + b] = int32_t(dst);
    const uint2* k_in = reinterpret_cast<const uint2*>(d.k + src * d.page_elems);
    const uint2* v_in = reinterpret_cast<const uint2*>(d.v + src * d.page_elems);
    uint4* k_out = reinterpret_cast<uint4*>(static_cast<T*>(d.k_out) + dst * d.page_elems);
    uint4* v_out = reinterpret_cast<uint4*>(static_cast<T*>(d.v_out) + dst * d.page_elems);
    for (int64_t c = threadIdx.x; c < chunks; c += kDequantThreads) {
      const uint2 kc = __ldg(k_in + c);
      const uint2 vc = __ldg(v_in + c);
      k_out[c] = convert(kc);
      v_out[c] = convert(vc);
    }
  }
}

}  // namespace

int64_t PrefillPagesNeeded(const int32_t* cu_seqlens_q, const int32_t* context_lens,
                           int64_t num_seqs, int64_t block_size) {
  int64_t pages = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    pages += SequencePages(cu_seqlens_q, context_lens, s, int(block_size));
  }
  return pages;
}

size_t PrefillFp8ScratchBytes(const PagedKvLayout& layout, DType dtype, int64_t num_seqs,
                              int64_t max_blocks_per_seq, int64_t num_pages) {
  return TableBytes(num_seqs, max_blocks_per_seq) +
         2 * AlignUp(size_t(num_pages) * PageBytes(layout, dtype));
}

namespace detail {

void LaunchPrefillWgmmaFp8(const PrefillArgs& a, const PrefillScratch& scratch,
                           cudaStream_t stream) {
  const PagedKvLayout layout{a.num_blocks, a.block_size, a.num_kv_heads, a.head_dim};
  const DType dtype = a.is_bf16 ? DType::kBF16 : DType::kF16;
  const int64_t capacity = scratch.num_pages;
  if (capacity <= 0 || a.num_seqs <= 0) return;
  auto* base = static_cast<std::byte*>(scratch.data);
  const size_t table_bytes = TableBytes(a.num_seqs, a.max_blocks_per_seq);
  const size_t pool_bytes = AlignUp(size_t(capacity) * PageBytes(layout, dtype));
  DequantArgs d;
  d.k = static_cast<const uint8_t*>(a.k);
  d.v = static_cast<const uint8_t*>(a.v);
  d.tables_out = reinterpret_cast<int32_t*>(base);
  d.k_out = base + table_bytes;
  d.v_out = base + table_bytes + pool_bytes;
  d.cu_seqlens_q = a.cu_seqlens_q;
  d.context_lens = a.context_lens;
  d.block_tables = a.block_tables;
  d.width = a.max_blocks_per_seq;
  d.num_blocks = a.num_blocks;
  d.capacity = capacity;
  d.page_elems = int64_t(a.num_kv_heads) * a.block_size * a.head_dim;
  d.block_size = a.block_size;
  d.sliding_window = a.sliding_window;
  if (d.page_elems % 8 != 0) {
    throw std::invalid_argument("PagedPrefillAttention (fp8 via v4): page of " +
                                std::to_string(d.page_elems) + " elements, not a multiple of 8");
  }
  // Columns: the longest sequence's pages when known (a mixed step's table width also covers
  // its decode rows' contexts), else the table width.
  int64_t columns = a.max_blocks_per_seq;
  if (a.max_num_keys > 0) {
    columns = std::min(columns, (a.max_num_keys + a.block_size - 1) / a.block_size);
  }
  const dim3 grid(unsigned(std::max<int64_t>(columns, 1)), unsigned(a.num_seqs));
  if (a.is_bf16) {
    DequantizePagesKernel<__nv_bfloat16><<<grid, kDequantThreads, 0, stream>>>(d);
  } else {
    DequantizePagesKernel<__half><<<grid, kDequantThreads, 0, stream>>>(d);
  }
  LLM_CUDA_CHECK(cudaGetLastError());
  PrefillArgs v4 = a;  // the same problem over the scratch pools (scales stay folded)
  v4.k = d.k_out;
  v4.v = d.v_out;
  v4.block_tables = d.tables_out;
  v4.num_blocks = capacity;
  v4.kv_fp8 = false;
  LaunchPrefillWgmma(v4, stream);
}

}  // namespace detail
}  // namespace llm::cuda
