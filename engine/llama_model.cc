#include "engine/llama_model.h"

#include <cmath>
#include <numbers>

#include "engine/checkpoint_check.h"
#include "engine/error.h"
#include "engine/safetensors.h"
#include "kernels/cpu/ops.h"

namespace llm {
namespace {

std::string LayerName(int64_t i, const char* suffix) {
  return "model.layers." + std::to_string(i) + "." + suffix;
}

// Converts `count` elements of `src` (any dtype) to fp32.
void ToF32(const TensorView& src, float* dst, int64_t count) {
  cpu::WeightMatrix m{src.dtype, src.data, 1, count};
  cpu::LoadRow(m, 0, dst);
}

}  // namespace

std::vector<float> RopeInvFreq(const ModelConfig& config) {
  const int64_t dim = config.head_dim;
  std::vector<float> inv_freq(static_cast<size_t>(dim / 2));
  const RopeScaling& s = config.rope_scaling;
  for (int64_t i = 0; i < dim / 2; ++i) {
    double f = 1.0 / std::pow(config.rope_theta, static_cast<double>(2 * i) / dim);
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

LlamaModel::~LlamaModel() = default;

cpu::WeightMatrix LlamaModel::Matrix(const std::string& name, std::vector<int64_t> shape) {
  const TensorView& t = checkpoint_->GetWithShape(name, shape);
  cpu::WeightMatrix m{t.dtype, t.data, shape[0], shape[1]};
  if (t.dtype == weight_dtype_) return m;  // zero copy: points into the mapping
  const int64_t n = shape[0] * shape[1];
  if (weight_dtype_ == DType::kF32) {
    owned32_.emplace_back(static_cast<size_t>(n));
    ToF32(t, owned32_.back().data(), n);
    m.data = owned32_.back().data();
  } else {
    owned16_.emplace_back(static_cast<size_t>(n));
    uint16_t* dst = owned16_.back().data();
    std::vector<float> row(static_cast<size_t>(shape[1]));
    for (int64_t r = 0; r < shape[0]; ++r) {
      cpu::LoadRow(m, r, row.data());
      for (int64_t c = 0; c < shape[1]; ++c) {
        dst[r * shape[1] + c] =
            weight_dtype_ == DType::kBF16 ? F32ToBf16(row[c]) : F32ToF16(row[c]);
      }
    }
    m.data = dst;
  }
  m.dtype = weight_dtype_;
  return m;
}

std::vector<float> LlamaModel::Vector(const std::string& name, int64_t size) {
  const TensorView& t = checkpoint_->GetWithShape(name, {size});
  std::vector<float> out(static_cast<size_t>(size));
  ToF32(t, out.data(), size);
  return out;
}

std::unique_ptr<LlamaModel> LlamaModel::Load(const std::string& model_dir,
                                             const LoadOptions& options) {
  std::unique_ptr<LlamaModel> m(new LlamaModel());
  m->config_ = ModelConfig::Load(model_dir);
  m->checkpoint_ = Checkpoint::Open(model_dir);
  ValidateCheckpoint(m->config_, *m->checkpoint_);
  const ModelConfig& c = m->config_;
  const TensorView& embed = m->checkpoint_->Get("model.embed_tokens.weight");
  m->weight_dtype_ = options.weight_dtype.value_or(embed.dtype);

  const int64_t hidden = c.hidden_size, q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim, inter = c.intermediate_size;
  m->embed_ = m->Matrix("model.embed_tokens.weight", {c.vocab_size, hidden});
  const bool has_head = m->checkpoint_->Find("lm_head.weight") != nullptr;
  m->lm_head_ = (c.tie_word_embeddings && !has_head)
                    ? m->embed_
                    : m->Matrix("lm_head.weight", {c.vocab_size, hidden});
  m->final_norm_ = m->Vector("model.norm.weight", hidden);
  m->layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& l = m->layers_[static_cast<size_t>(i)];
    l.input_norm = m->Vector(LayerName(i, "input_layernorm.weight"), hidden);
    l.post_attention_norm = m->Vector(LayerName(i, "post_attention_layernorm.weight"), hidden);
    l.q = m->Matrix(LayerName(i, "self_attn.q_proj.weight"), {q_dim, hidden});
    l.k = m->Matrix(LayerName(i, "self_attn.k_proj.weight"), {kv_dim, hidden});
    l.v = m->Matrix(LayerName(i, "self_attn.v_proj.weight"), {kv_dim, hidden});
    l.o = m->Matrix(LayerName(i, "self_attn.o_proj.weight"), {hidden, q_dim});
    l.gate = m->Matrix(LayerName(i, "mlp.gate_proj.weight"), {inter, hidden});
    l.up = m->Matrix(LayerName(i, "mlp.up_proj.weight"), {inter, hidden});
    l.down = m->Matrix(LayerName(i, "mlp.down_proj.weight"), {hidden, inter});
  }
  m->inv_freq_ = RopeInvFreq(c);
  return m;
}

int64_t LlamaModel::weight_bytes_per_token() const {
  int64_t bytes = lm_head_.num_bytes();
  for (const Layer& l : layers_) {
    for (const cpu::WeightMatrix* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      bytes += w->num_bytes();
    }
  }
  return bytes;
}

KvCache LlamaModel::NewCache(int64_t capacity) const {
  KvCache cache;
  cache.capacity = capacity;
  const size_t per_layer = static_cast<size_t>(capacity * config_.num_kv_heads * config_.head_dim);
  cache.k.assign(static_cast<size_t>(config_.num_layers), std::vector<float>(per_layer));
  cache.v.assign(static_cast<size_t>(config_.num_layers), std::vector<float>(per_layer));
  return cache;
}

void LlamaModel::Attention(const Layer& layer, int64_t layer_index, const float* normed, float* out,
                           int64_t num_tokens, KvCache& cache, const int32_t* positions) const {
  const ModelConfig& c = config_;
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  std::vector<float> q(static_cast<size_t>(num_tokens * q_dim));
  float* k_dst = cache.k[static_cast<size_t>(layer_index)].data() + cache.num_tokens * kv_dim;
  float* v_dst = cache.v[static_cast<size_t>(layer_index)].data() + cache.num_tokens * kv_dim;
  cpu::Linear(normed, layer.q, q.data(), num_tokens);
  cpu::Linear(normed, layer.k, k_dst, num_tokens);  // appended straight into the cache
  cpu::Linear(normed, layer.v, v_dst, num_tokens);
  cpu::ApplyRope(q.data(), num_tokens, c.num_heads, c.head_dim, positions, inv_freq_.data());
  cpu::ApplyRope(k_dst, num_tokens, c.num_kv_heads, c.head_dim, positions, inv_freq_.data());
  std::vector<float> attn(static_cast<size_t>(num_tokens * q_dim));
  cpu::AttentionPlain(q.data(), cache.k[static_cast<size_t>(layer_index)].data(),
                      cache.v[static_cast<size_t>(layer_index)].data(), attn.data(), num_tokens,
                      cache.num_tokens, c.num_heads, c.num_kv_heads, c.head_dim);
  cpu::Linear(attn.data(), layer.o, out, num_tokens);
}

void LlamaModel::Mlp(const Layer& layer, const float* normed, float* out,
                     int64_t num_tokens) const {
  const int64_t inter = config_.intermediate_size;
  std::vector<float> gate(static_cast<size_t>(num_tokens * inter));
  std::vector<float> up(static_cast<size_t>(num_tokens * inter));
  cpu::Linear(normed, layer.gate, gate.data(), num_tokens);
  cpu::Linear(normed, layer.up, up.data(), num_tokens);
  cpu::SiluMul(gate.data(), up.data(), gate.data(), num_tokens * inter);
  cpu::Linear(gate.data(), layer.down, out, num_tokens);
}

std::vector<float> LlamaModel::Forward(std::span<const int> tokens, KvCache& cache,
                                       bool all_logits) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size()), hidden = c.hidden_size;
  if (n == 0) throw Error("Forward: no tokens");
  if (cache.num_tokens + n > cache.capacity) {
    throw Error("sequence of " + std::to_string(cache.num_tokens + n) +
                " tokens exceeds the KV cache capacity of " + std::to_string(cache.capacity));
  }
  std::vector<float> x(static_cast<size_t>(n * hidden));
  std::vector<int32_t> positions(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const int id = tokens[static_cast<size_t>(t)];
    if (id < 0 || id >= c.vocab_size) {
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(c.vocab_size) + ")");
    }
    cpu::LoadRow(embed_, id, x.data() + t * hidden);
    positions[static_cast<size_t>(t)] = static_cast<int32_t>(cache.num_tokens + t);
  }
  std::vector<float> normed(x.size()), delta(x.size());
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const Layer& layer = layers_[static_cast<size_t>(i)];
    const float eps = static_cast<float>(c.rms_norm_eps);
    cpu::RmsNorm(x.data(), layer.input_norm.data(), normed.data(), n, hidden, eps);
    Attention(layer, i, normed.data(), delta.data(), n, cache, positions.data());
    cpu::AddInPlace(x.data(), delta.data(), n * hidden);
    cpu::RmsNorm(x.data(), layer.post_attention_norm.data(), normed.data(), n, hidden, eps);
    Mlp(layer, normed.data(), delta.data(), n);
    cpu::AddInPlace(x.data(), delta.data(), n * hidden);
  }
  cache.num_tokens += n;
  const int64_t num_out = all_logits ? n : 1;
  const float* last = x.data() + (n - num_out) * hidden;
  cpu::RmsNorm(last, final_norm_.data(), normed.data(), num_out, hidden,
               static_cast<float>(c.rms_norm_eps));
  std::vector<float> logits(static_cast<size_t>(num_out * c.vocab_size));
  cpu::Linear(normed.data(), lm_head_, logits.data(), num_out);
  return logits;
}

}  // namespace llm
