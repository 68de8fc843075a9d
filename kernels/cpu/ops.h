// Small fp32 CPU ops of the Llama forward: the references that the CUDA kernels are
// tested against. Shapes are given per argument; all tensors are row-major and contiguous.
#pragma once

#include <cstdint>
#include <vector>

namespace llm::cpu {

// out[t] = x[t] / sqrt(mean(x[t]²) + eps) * weight        x, out: [num_tokens, hidden]
// (out may alias x)
void RmsNorm(const float* x, const float* weight, float* out, int64_t num_tokens, int64_t hidden,
             float eps);

// x += y, elementwise over n values.
void AddInPlace(float* x, const float* y, int64_t n);

// out = silu(gate) * up, elementwise over n values (out may alias gate).
void SiluMul(const float* gate, const float* up, float* out, int64_t n);

// out = gelu_tanh(gate) * up (GeGLU; PyTorch's gelu(approximate="tanh"):
// 0.5·g·(1 + tanh(sqrt(2/π)·(g + 0.044715·g³)))), elementwise over n values.
void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n);

// x[t] += bias for every row t of x [num_tokens, dim].
void AddBias(float* x, const float* bias, int64_t num_tokens, int64_t dim);

// Rotary position embedding, Hugging Face "rotate half" convention:
//   x: [num_tokens, num_heads, head_dim], positions: [num_tokens]
//   inv_freq: [head_dim / 2] (already scaled for linear / llama3 rope scaling)
//   x[i] , x[i + d/2]  ->  x[i] cos - x[i+d/2] sin , x[i+d/2] cos + x[i] sin,  angle =
//   pos·inv_freq[i]
void ApplyRope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq);

// Plain (non-paged, full-row softmax) causal grouped-query attention of one sequence, the
// test reference until the paged flash-attention kernels replace it.
//   q:   [num_tokens, num_heads, head_dim]  for positions start_pos .. start_pos+num_tokens-1
//   k,v: [>= start_pos + num_tokens, num_kv_heads, head_dim]  the sequence's whole cache
//   out: [num_tokens, num_heads, head_dim]
void AttentionPlain(const float* q, const float* k, const float* v, float* out, int64_t num_tokens,
                    int64_t start_pos, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim);

// In-place numerically stable softmax over n values.
void Softmax(float* x, int64_t n);

}  // namespace llm::cpu
