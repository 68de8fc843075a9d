#include "engine/cpu/kv_cache.h"

#include <algorithm>
#include <stdexcept>

#include "engine/error.h"

namespace llm {

KvCacheDType ParseKvCacheDType(const std::string& name) {
  if (name == "auto" || name == "f32") return KvCacheDType::kF32;
  if (name == "fp8" || name == "fp8_e4m3") return KvCacheDType::kFp8E4m3;
  throw Error("--kv-cache-dtype must be auto, fp8 or fp8_e4m3 (got '" + name + "')");
}

KvCachePool::KvCachePool(const ModelConfig& config, int64_t num_blocks, int64_t block_size,
                         KvCacheDType dtype)
    : dtype_(dtype), num_layers_(config.num_layers) {
  if (num_blocks <= 0 || block_size <= 0) {
    throw Error("the KV cache needs at least one block of at least one token (got " +
                std::to_string(num_blocks) + " blocks of " + std::to_string(block_size) + ")");
  }
  layout_ = {num_blocks, block_size, config.num_kv_heads, config.head_dim};
  const size_t n = static_cast<size_t>(layout_.pool_elements());
  const size_t layers = static_cast<size_t>(config.num_layers);
  if (dtype == KvCacheDType::kFp8E4m3) {
    k8_.assign(layers, std::vector<uint8_t>(n));
    v8_.assign(layers, std::vector<uint8_t>(n));
  } else {
    k_.assign(layers, std::vector<float>(n));
    v_.assign(layers, std::vector<float>(n));
  }
}

int64_t KvCachePool::BytesPerBlock(const ModelConfig& config, int64_t block_size,
                                   KvCacheDType dtype) {
  const int64_t elem = dtype == KvCacheDType::kFp8E4m3 ? 1 : static_cast<int64_t>(sizeof(float));
  return 2 * config.num_layers * config.num_kv_heads * block_size * config.head_dim * elem;
}

int64_t KvCachePool::NumBlocksForBytes(const ModelConfig& config, int64_t block_size, int64_t bytes,
                                       KvCacheDType dtype) {
  return bytes / BytesPerBlock(config, block_size, dtype);
}

PagedKvView<float> KvCachePool::Layer(int64_t layer) {
  if (dtype_ != KvCacheDType::kF32) throw std::logic_error("KvCachePool: fp32 view of fp8 pools");
  const size_t i = static_cast<size_t>(layer);
  return {k_[i].data(), v_[i].data(), layout_};
}

PagedKvView<const float> KvCachePool::Layer(int64_t layer) const {
  if (dtype_ != KvCacheDType::kF32) throw std::logic_error("KvCachePool: fp32 view of fp8 pools");
  const size_t i = static_cast<size_t>(layer);
  return {k_[i].data(), v_[i].data(), layout_};
}

PagedKvView<uint8_t> KvCachePool::Fp8Layer(int64_t layer) {
  if (dtype_ != KvCacheDType::kFp8E4m3) {
    throw std::logic_error("KvCachePool: fp8 view of fp32 pools");
  }
  const size_t i = static_cast<size_t>(layer);
  return {k8_[i].data(), v8_[i].data(), layout_};
}

namespace {

template <typename T>
void CopyPoolBlocks(std::vector<std::vector<T>>& pools, int64_t stride,
                    std::span<const BlockCopy> copies) {
  for (std::vector<T>& pool : pools) {
    for (const BlockCopy& c : copies) {
      const T* src = pool.data() + c.src_block * stride;
      std::copy(src, src + stride, pool.data() + c.dst_block * stride);
    }
  }
}

}  // namespace

void KvCachePool::CopyBlocks(std::span<const BlockCopy> copies) {
  const int64_t stride = layout_.block_stride();
  CopyPoolBlocks(k_, stride, copies);
  CopyPoolBlocks(v_, stride, copies);
  CopyPoolBlocks(k8_, stride, copies);
  CopyPoolBlocks(v8_, stride, copies);
}

}  // namespace llm
