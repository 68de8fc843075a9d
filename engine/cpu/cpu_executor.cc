#include "engine/cpu/cpu_executor.h"

#include <string>

namespace llm {

CpuExecutor::CpuExecutor(const CpuModel& model, int64_t num_blocks, int64_t block_size,
                         KvCacheDType kv_dtype)
    : model_(model), kv_(model.config(), num_blocks, block_size, kv_dtype) {}

std::string CpuExecutor::Describe() const {
  return "cpu, " + model_.WeightsDescription() + " weights, " +
         (kv_.dtype() == KvCacheDType::kFp8E4m3 ? "fp8 (e4m3)" : "f32") + " KV cache";
}

}  // namespace llm
