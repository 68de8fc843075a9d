// The KV cache's storage on the CPU backend: per layer, a K pool and a V pool in the layout
// of kernels/paged_kv.h. Which blocks belong to whom is the BlockManager's business; this
// class only holds the bytes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/block_manager.h"
#include "engine/model_config.h"
#include "kernels/paged_kv.h"

namespace llm {

class KvCachePool {
 public:
  KvCachePool(const ModelConfig& config, int64_t num_blocks, int64_t block_size);

  // How many blocks fit in `bytes` (fp32 K and V for every layer).
  static int64_t NumBlocksForBytes(const ModelConfig& config, int64_t block_size, int64_t bytes);
  static int64_t BytesPerBlock(const ModelConfig& config, int64_t block_size);

  const PagedKvLayout& layout() const { return layout_; }
  int64_t num_layers() const { return static_cast<int64_t>(k_.size()); }
  PagedKvView<float> Layer(int64_t layer);
  PagedKvView<const float> Layer(int64_t layer) const;

  // Performs the block manager's copy-on-write copies, in every layer.
  void CopyBlocks(std::span<const BlockCopy> copies);

 private:
  PagedKvLayout layout_;
  std::vector<std::vector<float>> k_, v_;  // [num_layers][pool_elements]
};

}  // namespace llm
