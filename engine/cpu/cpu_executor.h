// The CPU backend's executor: the CPU forward (engine/cpu/cpu_model.h) over a KV pool in host
// memory (engine/cpu/kv_cache.h), sampling on the host (ModelExecutor's defaults).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model.h"
#include "engine/cpu/kv_cache.h"
#include "engine/executor.h"

namespace llm {

// The CPU backend: fp32 compute over a CpuModel (not owned) and an fp32 KV pool.
class CpuExecutor final : public ModelExecutor {
 public:
  CpuExecutor(const CpuModel& model, int64_t num_blocks, int64_t block_size,
              KvCacheDType kv_dtype = KvCacheDType::kF32);

  const ModelConfig& config() const override { return model_.config(); }
  std::string Describe() const override;
  int64_t num_kv_blocks() const override { return kv_.layout().num_blocks; }
  int64_t block_size() const override { return kv_.layout().block_size; }
  void CopyBlocks(std::span<const BlockCopy> copies) override { kv_.CopyBlocks(copies); }
  std::vector<float> Forward(const ForwardBatch& batch) override {
    return model_.Forward(batch, kv_);
  }

 private:
  const CpuModel& model_;
  KvCachePool kv_;
};

}  // namespace llm
