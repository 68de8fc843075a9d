#include "engine/kv_cache.h"

#include <algorithm>

#include "engine/error.h"

namespace llm {

KvCachePool::KvCachePool(const ModelConfig& config, int64_t num_blocks, int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    throw Error("the KV cache needs at least one block of at least one token (got " +
                std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + ")");
  }
  layout_ = {num_blocks, block_size, config.num_kv_heads, config.head_dim};
  const size_t n = static_cast<size_t>(layout_.pool_elements());
  k_.assign(static_cast<size_t>(config.num_layers), std::vector<float>(n));
  v_.assign(static_cast<size_t>(config.num_layers), std::vector<float>(n));
}

int64_t KvCachePool::BytesPerBlock(const ModelConfig& config, int64_t block_size) {
  return 2 * config.num_layers * config.num_kv_heads * block_size * config.head_dim *
         static_cast<int64_t>(sizeof(float));
}

int64_t KvCachePool::NumBlocksForBytes(const ModelConfig& config, int64_t block_size,
                                       int64_t bytes) {
  return bytes / BytesPerBlock(config, block_size);
}

PagedKvView<float> KvCachePool::Layer(int64_t layer) {
  const size_t i = static_cast<size_t>(layer);
  return {k_[i].data(), v_[i].data(), layout_};
}

PagedKvView<const float> KvCachePool::Layer(int64_t layer) const {
  const size_t i = static_cast<size_t>(layer);
  return {k_[i].data(), v_[i].data(), layout_};
}

void KvCachePool::CopyBlocks(std::span<const BlockCopy> copies) {
  const int64_t stride = layout_.block_stride();
  for (size_t layer = 0; layer < k_.size(); ++layer) {
    for (const BlockCopy& c : copies) {
      for (std::vector<float>* pool : {&k_[layer], &v_[layer]}) {
        const float* src = pool->data() + c.src_block * stride;
        std::copy(src, src + stride, pool->data() + c.dst_block * stride);
      }
    }
  }
}

}  // namespace llm
