// Shared by the CUDA executor's GPU tests: the skip-without-GPU fixture, small executor
// options, and every position's logits through ModelExecutor::Forward (a prefill chunk, then
// one decode step per token).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/cuda/cuda_executor.h"
#include "engine/forward_batch.h"

namespace llm::test {

inline constexpr int64_t kBlockSize = 16;

class CudaExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!CudaBackendAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

inline CudaExecutorOptions SmallOptions(DType dtype = DType::kBF16, bool graphs = true) {
  CudaExecutorOptions o;
  o.dtype = dtype;
  o.block_size = kBlockSize;
  o.max_num_batched_tokens = 256;
  o.max_num_seqs = 16;
  o.num_kv_blocks = 128;
  o.max_logits_rows = 256;
  o.cuda_graphs = graphs;
  o.log = false;
  return o;
}

// Every position's logits: a prefill chunk of `prefill` tokens, then one decode step per
// remaining token (sequence 0 over blocks 0, 1, ...).
inline std::vector<float> AllLogits(ModelExecutor& ex, const std::vector<int>& ids,
                                    int64_t prefill) {
  const int64_t n = std::ssize(ids);
  std::vector<int32_t> table;
  for (int64_t b = 0; b * kBlockSize < n; ++b) table.push_back(int32_t(b));
  std::vector<float> out;
  for (int64_t pos = 0; pos < n;) {
    const int64_t len = pos == 0 ? prefill : 1;
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < len; ++i) slots.push_back(pos + i);
    ForwardBatch batch;
    batch.AddSequence(
        std::span<const int>(ids.data() + pos, size_t(len)), pos,
        std::span<const int32_t>(table.data(), size_t((pos + len + kBlockSize - 1) / kBlockSize)),
        slots, true, /*is_decode=*/pos > 0);
    batch.logits_indices.clear();
    for (int64_t i = 0; i < len; ++i) batch.logits_indices.push_back(int32_t(i));
    const std::vector<float> logits = ex.Forward(batch);
    out.insert(out.end(), logits.begin(), logits.end());
    pos += len;
  }
  return out;
}

}  // namespace llm::test
