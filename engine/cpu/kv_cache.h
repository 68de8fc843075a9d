// The KV cache's storage on the CPU backend: per layer, a K pool and a V pool in the layout
// of kernels/paged_kv.h, fp32 or fp8 e4m3 (--kv-cache-dtype fp8: a quarter of the bytes,
// kernels/fp8.h, with per-tensor scales of 1 as vLLM's uncalibrated default). Which blocks
// belong to whom is the BlockManager's business; this class only holds the bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/sched/block_manager.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/paged_kv.h"

namespace llm {

enum class KvCacheDType { kF32, kFp8E4m3 };

// "auto" / "f32" -> kF32, "fp8" / "fp8_e4m3" -> kFp8E4m3 (vLLM's --kv-cache-dtype names);
// throws llm::Error for anything else.
KvCacheDType ParseKvCacheDType(const std::string& name);

class KvCachePool {
 public:
  KvCachePool(const ModelConfig& config, int64_t num_blocks, int64_t block_size,
              KvCacheDType dtype = KvCacheDType::kF32);

  // How many blocks fit in `bytes` (K and V of every layer, in `dtype`).
  static int64_t NumBlocksForBytes(const ModelConfig& config, int64_t block_size, int64_t bytes,
                                   KvCacheDType dtype = KvCacheDType::kF32);
  static int64_t BytesPerBlock(const ModelConfig& config, int64_t block_size,
                               KvCacheDType dtype = KvCacheDType::kF32);

  const PagedKvLayout& layout() const { return layout_; }
  KvCacheDType dtype() const { return dtype_; }
  int64_t num_layers() const { return num_layers_; }
  // fp32 pools (dtype kF32).
  PagedKvView<float> Layer(int64_t layer);
  PagedKvView<const float> Layer(int64_t layer) const;
  // fp8 pools (dtype kFp8E4m3) and their scales.
  PagedKvView<uint8_t> Fp8Layer(int64_t layer);
  cpu::Fp8KvScales fp8_scales() const { return scales_; }

  // Performs the block manager's copy-on-write copies, in every layer.
  void CopyBlocks(std::span<const BlockCopy> copies);

 private:
  PagedKvLayout layout_;
  KvCacheDType dtype_ = KvCacheDType::kF32;
  int64_t num_layers_ = 0;
  std::vector<std::vector<float>> k_, v_;      // fp32: [num_layers][pool_elements]
  std::vector<std::vector<uint8_t>> k8_, v8_;  // fp8:  [num_layers][pool_elements]
  cpu::Fp8KvScales scales_;
};

}  // namespace llm
