// Paged prefill attention: the selector. Turns (dtype, head_dim, variant, batch shape) into one
// rung of the ladder (prefill_attention.h lists the rungs) and its argument block; each rung's
// file instantiates its kernels (the tile traits live there, with static_asserts).
//   kBest = v4 (wgmma, TMA one box per page) when the page size suits TMA boxes
//           (block_size a multiple of 8 that divides the 128-key tile), else v3 (mma.sync);
//           head_dim 256 (Gemma 3): v3, the one tiled rung built for it;
//           fp8 (e4m3) caches: v4 over an exact bf16 / fp16 copy of the batch's pages when the
//           caller gives a PrefillScratch that holds them (prefill_attention_fp8.cu), else v3,
//           which dequantizes each tile in shared memory.
// Test:  ninja -C build prefill_attention_gpu_test &&
//        (cd build && ctest -L gpu -R prefill_attention)
//        e4m3 caches: the kv_fp8*_gpu_test targets, then ctest -L gpu -R kv_fp8
// Bench: ninja -C build bench_prefill_attention_gpu && ./build/bench_prefill_attention_gpu
//        (--kv fp8: the e4m3 caches, v3 and v4)
#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention/prefill_attention.h"
#include "kernels/cuda/common/cuda_check.h"

namespace llm::cuda {

const char* PrefillVariantName(PrefillVariant v) {
  switch (v) {
    case PrefillVariant::kNaive:
      return "v1_naive";
    case PrefillVariant::kSmem:
      return "v2_smem";
    case PrefillVariant::kMma:
      return "v3_mma";
    case PrefillVariant::kWgmma:
      return "v4_wgmma";
    case PrefillVariant::kBest:
      return "best";
  }
  return "?";
}

namespace {

bool WgmmaSupports(const AttentionParams& p) {
  const int64_t bs = p.kv.layout.block_size;
  // One TMA box per page: 8-row swizzle atoms, whole pages per 128-key tile. 16-byte aligned
  // pools (cudaMalloc gives 256).
  return PrefillWgmmaTakesBlockSize(bs) && reinterpret_cast<uintptr_t>(p.kv.k) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.kv.v) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(p.q) % 16 == 0;
}

// An fp8 batch can take v4 over a copy of its pages: the scratch holds them.
bool ScratchFits(const AttentionParams& p, const PrefillScratch* scratch) {
  return scratch != nullptr && scratch->data != nullptr && scratch->num_pages > 0 &&
         reinterpret_cast<uintptr_t>(scratch->data) % 256 == 0 &&
         scratch->bytes >= PrefillFp8ScratchBytes(p.kv.layout, p.dtype, p.batch.num_seqs,
                                                  p.batch.max_blocks_per_seq, scratch->num_pages);
}

}  // namespace

bool PrefillWgmmaTakesBlockSize(int64_t bs) { return bs >= 8 && bs % 8 == 0 && 128 % bs == 0; }

PrefillVariant ResolvePrefillVariant(const AttentionParams& p, PrefillVariant requested,
                                     const PrefillScratch* scratch) {
  if (p.dtype != DType::kBF16 && p.dtype != DType::kF16) {
    throw std::invalid_argument("PagedPrefillAttention: dtype " + std::string(DTypeName(p.dtype)) +
                                " unsupported (BF16 or F16)");
  }
  const int64_t hd = p.kv.layout.head_dim;
  // The tiled rungs are built for head_dim 64 and 128 (v2 .. v4) and 256 (v3); the naive rung
  // takes any head_dim up to 256 (tiny test models such as stories260K have 8), slowly.
  if (hd < 1 || hd > 256) {
    throw std::invalid_argument("PagedPrefillAttention: head_dim " + std::to_string(hd) +
                                " unsupported (64, 128 or 256; others up to 256 by v1_naive only)");
  }
  if (p.batch.sliding_window < 0) {
    throw std::invalid_argument("PagedPrefillAttention: sliding_window " +
                                std::to_string(p.batch.sliding_window) +
                                " (0 = full attention, or a positive window)");
  }
  if (p.batch.sliding_window > 0 && !p.causal) {
    throw std::invalid_argument(
        "PagedPrefillAttention: a sliding window is causal (non-causal attention has none)");
  }
  // fp8 pools reach v4 through a copy of their pages (prefill_attention_fp8.cu).
  const bool v4_pools = !p.kv_format.fp8 || ScratchFits(p, scratch);
  if (!p.causal) {  // the benchmark shapes' non-causal case: v4 alone has the mode
    if ((requested == PrefillVariant::kBest || requested == PrefillVariant::kWgmma) && v4_pools &&
        (hd == 64 || hd == 128) && WgmmaSupports(p)) {
      return PrefillVariant::kWgmma;
    }
    throw std::invalid_argument(std::string("PagedPrefillAttention: non-causal attention runs on "
                                            "v4_wgmma only (head_dim 64/128, bf16/fp16 pools or "
                                            "fp8 with a PrefillScratch, block size 8…128); "
                                            "asked for ") +
                                PrefillVariantName(requested));
  }
  if (hd != 64 && hd != 128 && hd != 256) {
    if (requested == PrefillVariant::kBest) return PrefillVariant::kNaive;
    if (requested != PrefillVariant::kNaive) {
      throw std::invalid_argument("PagedPrefillAttention: head_dim " + std::to_string(hd) +
                                  " runs on v1_naive only (the tiled rungs take 64 or 128; "
                                  "v3_mma also 256)");
    }
  }
  if (hd == 256) {  // Gemma 3: v3_mma (kBest) and v1_naive
    if (requested == PrefillVariant::kSmem || requested == PrefillVariant::kWgmma) {
      throw std::invalid_argument(std::string("PagedPrefillAttention: head_dim 256 runs on "
                                              "v3_mma and v1_naive only; asked for ") +
                                  PrefillVariantName(requested));
    }
  }
  if (p.num_heads <= 0 || p.kv.layout.num_kv_heads <= 0 ||
      p.num_heads % p.kv.layout.num_kv_heads != 0) {
    throw std::invalid_argument("PagedPrefillAttention: num_heads " + std::to_string(p.num_heads) +
                                " not a multiple of num_kv_heads " +
                                std::to_string(p.kv.layout.num_kv_heads));
  }
  const bool v4_dim = hd == 64 || hd == 128;
  if (p.kv_format.fp8) {  // e4m3 pools: v1 and v3 dequantize as they load, v4 reads a copy
    const bool v4 = v4_pools && v4_dim && WgmmaSupports(p);
    if (requested == PrefillVariant::kBest) {
      return v4 ? PrefillVariant::kWgmma : PrefillVariant::kMma;
    }
    if (requested == PrefillVariant::kWgmma && !v4) {
      throw std::invalid_argument(
          "PagedPrefillAttention: v4_wgmma reads fp8 KV caches through a bf16 / fp16 copy of "
          "the pages: it needs a PrefillScratch of PrefillFp8ScratchBytes(...) for the batch's "
          "pages and block_size a multiple of 8 dividing 128 (got block_size " +
          std::to_string(p.kv.layout.block_size) + ")");
    }
    if (requested == PrefillVariant::kSmem) {
      throw std::invalid_argument(std::string("PagedPrefillAttention: ") +
                                  PrefillVariantName(requested) +
                                  " does not read fp8 KV caches (v1_naive, v3_mma and v4_wgmma "
                                  "with a PrefillScratch do)");
    }
    return requested;
  }
  if (requested == PrefillVariant::kBest) {
    return v4_dim && WgmmaSupports(p) ? PrefillVariant::kWgmma : PrefillVariant::kMma;
  }
  if (requested == PrefillVariant::kWgmma && !WgmmaSupports(p)) {
    throw std::invalid_argument(
        "PagedPrefillAttention: v4_wgmma needs block_size a multiple of 8 "
        "dividing 128, got " +
        std::to_string(p.kv.layout.block_size));
  }
  return requested;
}

PrefillVariant PagedPrefillAttention(const AttentionParams& p, cudaStream_t stream,
                                     PrefillVariant variant, const PrefillScratch* scratch,
                                     int v4_flags) {
  // non-causal: v4 or an error; fp8: v4 only with a scratch that fits
  const PrefillVariant v = ResolvePrefillVariant(p, variant, scratch);
  if (p.batch.num_seqs == 0 || p.max_q_len == 0) return v;
  detail::PrefillArgs a;
  a.q = p.q;
  a.out = p.out;
  a.k = p.kv.k;
  a.v = p.kv.v;
  a.cu_seqlens_q = p.batch.cu_seqlens_q;
  a.context_lens = p.batch.context_lens;
  a.block_tables = p.batch.block_tables;
  a.max_blocks_per_seq = p.batch.max_blocks_per_seq;
  a.num_blocks = p.kv.layout.num_blocks;
  a.num_seqs = static_cast<int>(p.batch.num_seqs);
  a.num_heads = static_cast<int>(p.num_heads);
  a.num_kv_heads = static_cast<int>(p.kv.layout.num_kv_heads);
  a.group = a.num_heads / a.num_kv_heads;
  a.head_dim = static_cast<int>(p.kv.layout.head_dim);
  a.block_size = static_cast<int>(p.kv.layout.block_size);
  a.max_q_len = static_cast<int>(p.max_q_len);
  a.max_num_keys = p.max_num_keys;
  a.kv_fp8 = p.kv_format.fp8;
  a.scale_log2 = p.scale * 1.44269504088896340736f * (a.kv_fp8 ? p.kv_format.k_scale : 1.f);
  a.out_scale = a.kv_fp8 ? p.kv_format.v_scale : 1.f;
  a.is_bf16 = p.dtype == DType::kBF16;
  a.v4_flags = detail::ResolveV4Flags(v4_flags, p.kv.layout.head_dim);
  a.causal = p.causal;
  // A window of 2^31 keys or more covers every sequence (lengths are int32).
  a.sliding_window = static_cast<int>(std::min<int64_t>(p.batch.sliding_window, 0x7fffffff));
  switch (v) {
    case PrefillVariant::kNaive:
      detail::LaunchPrefillNaive(a, stream);
      break;
    case PrefillVariant::kSmem:
      detail::LaunchPrefillSmem(a, stream);
      break;
    case PrefillVariant::kMma:
      detail::LaunchPrefillMma(a, stream);
      break;
    case PrefillVariant::kWgmma:
    case PrefillVariant::kBest:
      if (a.kv_fp8) {
        detail::LaunchPrefillWgmmaFp8(a, *scratch, stream);
      } else {
        detail::LaunchPrefillWgmma(a, stream);
      }
      break;
  }
  LLM_CUDA_CHECK(cudaGetLastError());
  return v;
}

}  // namespace llm::cuda
