#include "engine/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace llm {

std::vector<float> RopeInvFreq(const ModelConfig& config) {
  return RopeInvFreq(RopeParameters{config.rope_theta, config.rope_scaling}, config.head_dim);
}

std::vector<float> RopeInvFreq(const RopeParameters& rope, int64_t dim) {
  std::vector<float> inv_freq(static_cast<size_t>(dim / 2));
  const RopeScaling& s = rope.scaling;
  for (int64_t i = 0; i < dim / 2; ++i) {
    double f = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / dim);
    if (s.type == RopeScaling::Type::kLinear) {
      f /= s.factor;
    } else if (s.type == RopeScaling::Type::kLlama3) {
      // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band in
      // between interpolated smoothly.
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double low_freq_wavelen = old_len / s.low_freq_factor;
      const double high_freq_wavelen = old_len / s.high_freq_factor;
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen > low_freq_wavelen) {
        f /= s.factor;
      } else if (wavelen >= high_freq_wavelen) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv_freq[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return inv_freq;
}

}  // namespace llm
