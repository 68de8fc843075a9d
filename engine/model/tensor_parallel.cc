#include "engine/model/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/error.h"

namespace llm {

namespace {

void CheckDivides(int size, int64_t value, const char* what) {
  if (value % size != 0) {
    throw Error("--tensor-parallel-size " + std::to_string(size) + " does not divide the model's " +
                what + " (" + std::to_string(value) + ")");
  }
}

}  // namespace

TensorParallelShard MakeTensorParallelShard(const ModelConfig& c, int rank, int size) {
  if (size < 1) throw Error("--tensor-parallel-size must be at least 1");
  if (rank < 0 || rank >= size) {
    throw Error("tensor-parallel rank " + std::to_string(rank) + " is outside [0, " +
                std::to_string(size) + ")");
  }
  CheckDivides(size, c.num_heads, "attention heads");
  if (c.num_kv_heads % size != 0 && size % c.num_kv_heads != 0) {
    throw Error("--tensor-parallel-size " + std::to_string(size) +
                " neither divides nor is a multiple of the model's key-value heads (" +
                std::to_string(c.num_kv_heads) + ")");
  }
  CheckDivides(size, c.intermediate_size, "intermediate size");
  if (c.num_experts > 0) {
    CheckDivides(size, c.moe_intermediate_size, "experts' intermediate size");
  }
  TensorParallelShard s;
  s.rank = rank;
  s.size = size;
  s.num_heads = c.num_heads / size;
  // More ranks than KV heads: each KV head is replicated on size / KV ranks (vLLM does so).
  s.num_kv_heads = std::max<int64_t>(1, c.num_kv_heads / size);
  s.kv_head_begin = int64_t(rank) * c.num_kv_heads / size;
  s.intermediate = c.intermediate_size / size;
  s.moe_intermediate = c.num_experts > 0 ? c.moe_intermediate_size / size : 0;
  s.head_dim = c.head_dim;
  s.hidden = c.hidden_size;
  return s;
}

TpSlice TensorParallelShard::Slice(TpSplit split) const {
  switch (split) {
    case TpSplit::kReplicated:
      return {};
    case TpSplit::kQHeadRows:
      return {rank * q_dim(), q_dim(), 0, hidden};
    case TpSplit::kKvHeadRows:
      return {kv_head_begin * head_dim, kv_dim(), 0, hidden};
    case TpSplit::kQHeadCols:
      return {0, hidden, rank * q_dim(), q_dim()};
    case TpSplit::kIntermediateRows:
      return {rank * intermediate, intermediate, 0, hidden};
    case TpSplit::kIntermediateCols:
      return {0, hidden, rank * intermediate, intermediate};
    case TpSplit::kExpertRows:
      return {rank * moe_intermediate, moe_intermediate, 0, hidden};
    case TpSplit::kExpertCols:
      return {0, hidden, rank * moe_intermediate, moe_intermediate};
  }
  return {};
}

TpSlice TensorParallelShard::Slice(const WeightSpec& w, const ModelConfig& config) const {
  if (w.tp != TpSplit::kReplicated) return Slice(w.tp);
  const std::vector<int64_t> shape = WeightShape(w, config);
  return {0, shape[0], 0, shape.size() > 1 ? shape[1] : 1};
}

void CopySlice(const void* src, int64_t cols, const TpSlice& s, size_t elem_size, void* dst) {
  const auto* in = static_cast<const std::byte*>(src);
  auto* out = static_cast<std::byte*>(dst);
  const size_t row_bytes = size_t(s.num_cols) * elem_size;
  for (int64_t r = 0; r < s.num_rows; ++r) {
    std::memcpy(out + size_t(r) * row_bytes,
                in + (size_t(s.row_begin + r) * size_t(cols) + size_t(s.col_begin)) * elem_size,
                row_bytes);
  }
}

}  // namespace llm
