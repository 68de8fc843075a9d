// fp32 CPU ops (see ops.h). Written for clarity first; the loops are simple enough for the
// compiler to vectorise, and the heavy lifting of a forward pass is in matmul.cc.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

namespace llm::cpu {

void RmsNorm(const float* x, const float* weight, float* out, int64_t num_tokens, int64_t hidden,
             float eps) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* row = x + t * hidden;
    float sum_sq = 0.f;
    for (int64_t i = 0; i < hidden; ++i) sum_sq += row[i] * row[i];
    const float inv_rms = 1.f / std::sqrt(sum_sq / static_cast<float>(hidden) + eps);
    float* dst = out + t * hidden;
    for (int64_t i = 0; i < hidden; ++i) dst[i] = weight[i] * (row[i] * inv_rms);
  }
}

void AddInPlace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void SiluMul(const float* gate, const float* up, float* out, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void GeluTanhMul(const float* gate, const float* up, float* out, int64_t n) {
  const float k = std::sqrt(2.f / std::numbers::pi_v<float>);
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + std::tanh(k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void AddBias(float* x, const float* bias, int64_t num_tokens, int64_t dim) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    float* row = x + t * dim;
    for (int64_t i = 0; i < dim; ++i) row[i] += bias[i];
  }
}

void ApplyRope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq) {
  const int64_t half = head_dim / 2;
  std::vector<float> cos_v(static_cast<size_t>(half)), sin_v(static_cast<size_t>(half));
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // fp32 angle as Hugging Face computes it (inv_freq · position in float32).
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos_v[i] - b * sin_v[i];
        v[i + half] = b * cos_v[i] + a * sin_v[i];
      }
    }
  }
}

void Softmax(float* x, int64_t n) {
  float max_v = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max_v = std::max(max_v, x[i]);
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_v);
    sum += x[i];
  }
  const float inv = 1.f / sum;
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void AttentionPlain(const float* q, const float* k, const float* v, float* out, int64_t num_tokens,
                    int64_t start_pos, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t group = num_heads / num_kv_heads;
  const float scale = 1.f / std::sqrt(static_cast<float>(head_dim));
  const int64_t num_keys_max = start_pos + num_tokens;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(num_keys_max));
#pragma omp for collapse(2) schedule(static)
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int64_t h = 0; h < num_heads; ++h) {
        const int64_t kv_h = h / group;
        const int64_t num_keys = start_pos + t + 1;  // causal: keys 0..pos
        const float* qv = q + (t * num_heads + h) * head_dim;
        for (int64_t j = 0; j < num_keys; ++j) {
          const float* kv = k + (j * num_kv_heads + kv_h) * head_dim;
          float dot = 0.f;
          for (int64_t d = 0; d < head_dim; ++d) dot += qv[d] * kv[d];
          scores[j] = dot * scale;
        }
        Softmax(scores.data(), num_keys);
        float* o = out + (t * num_heads + h) * head_dim;
        std::fill(o, o + head_dim, 0.f);
        for (int64_t j = 0; j < num_keys; ++j) {
          const float* vv = v + (j * num_kv_heads + kv_h) * head_dim;
          const float p = scores[j];
          for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vv[d];
        }
      }
    }
  }
}

}  // namespace llm::cpu
