#include "engine/cpu/cpu_model.h"

#include <malloc.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <numbers>
#include <stdexcept>

#include "engine/cpu/kv_cache.h"
#include "engine/error.h"
#include "engine/loader/checkpoint_check.h"
#include "engine/loader/safetensors.h"
#include "engine/model/architecture.h"
#include "kernels/cpu/flash_attention.h"
#include "kernels/cpu/matmul_half.h"
#include "kernels/cpu/matmul_int8.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/ops.h"

namespace llm {
namespace {

// Rows [begin, begin + count) of a matrix, pointing into it (with its fp8 row scales).
cpu::WeightMatrix RowRange(const cpu::WeightMatrix& m, int64_t begin, int64_t count) {
  cpu::WeightMatrix r = m;
  r.data = static_cast<const std::byte*>(m.data) +
           begin * m.cols * static_cast<int64_t>(DTypeSize(m.dtype));
  r.rows = count;
  if (m.scales != nullptr) r.scales = m.scales + begin;
  return r;
}

// Converts `count` elements of `src` (any dtype) to fp32.
void ToF32(const TensorView& src, float* dst, int64_t count) {
  cpu::WeightMatrix m{src.dtype, src.data, 1, count};
  cpu::LoadRow(m, 0, dst);
}

}  // namespace

CpuModel::~CpuModel() = default;

void CpuModel::FreeDeleter::operator()(void* p) const { std::free(p); }

void* CpuModel::AllocateWeights(size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = (std::max<size_t>(bytes, 1) + kHuge - 1) / kHuge * kHuge;
  void* p = nullptr;
  if (posix_memalign(&p, kHuge, size) != 0) throw std::bad_alloc();
  madvise(p, size, MADV_HUGEPAGE);  // a hint: without THP the pages stay 4 KiB
  owned_.emplace_back(p);
  return p;
}

// Matrices end up in memory of our own (AllocateWeights), converted to weight_dtype_ or, for
// 16-bit weights stored as such, copied out of the mapping: the decode kernels stream them
// ~17% faster there (TinyLlama-1.1B shape, bf16, 2 threads, 2026-12-05: 12.2 against 10.4
// tok/s from the mapped file's pages) and their 64-byte loads never split a cache line.
// f32 weights stored as f32 stay in the mapping (their kernel measured no gain).
cpu::WeightMatrix CpuModel::Matrix(const std::string& name, std::vector<int64_t> shape) {
  const TensorView& t = checkpoint_->GetWithShape(name, shape);
  cpu::WeightMatrix m{t.dtype, t.data, shape[0], shape[1]};
  const int64_t n = shape[0] * shape[1];
  // 16-bit weights the packed kernel reads: row-major in staging16_ until Packed() moves them.
  const bool stage = weight_dtype_ != DType::kF32 && cpu::HalfKernelWantsPacked();
  auto out16 = [&] {
    if (!stage) return static_cast<uint16_t*>(AllocateWeights(size_t(n) * 2));
    staging16_.resize(size_t(n));
    return staging16_.data();
  };
  if (t.dtype == weight_dtype_) {
    if (t.dtype == DType::kF32) return m;  // zero copy: points into the mapping
    uint16_t* dst = out16();
    std::memcpy(dst, t.data, size_t(n) * 2);
    m.data = dst;
    return m;
  }
  if (weight_dtype_ == DType::kF32) {
    auto* dst = static_cast<float*>(AllocateWeights(size_t(n) * 4));
    ToF32(t, dst, n);
    m.data = dst;
  } else {
    uint16_t* dst = out16();
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

cpu::WeightMatrix CpuModel::LinearMatrix(const std::string& name, std::vector<int64_t> shape) {
  if (!fp8_weights_ && !int8_weights_) return Matrix(name, shape);
  const TensorView& t = checkpoint_->GetWithShape(name, shape);
  const int64_t rows = shape[0], cols = shape[1];
  std::vector<float> f32(static_cast<size_t>(rows * cols));
  ToF32(t, f32.data(), rows * cols);
  owned32_.emplace_back(static_cast<size_t>(rows));
  const bool stage = int8_weights_ && cpu::Int8KernelWantsPacked();
  if (stage) staging_.resize(size_t(rows * cols));
  auto* codes = stage ? reinterpret_cast<uint8_t*>(staging_.data())
                      : static_cast<uint8_t*>(AllocateWeights(size_t(rows * cols)));
  float* scales = owned32_.back().data();
  const bool ok = int8_weights_ ? cpu::QuantizeInt8Rows(f32.data(), rows, cols,
                                                        reinterpret_cast<int8_t*>(codes), scales)
                                : cpu::QuantizeFp8Rows(f32.data(), rows, cols, codes, scales);
  if (!ok) {
    throw Error(t.file + ": tensor " + name + " holds a NaN or infinite weight (--quantization " +
                (int8_weights_ ? "int8" : "fp8") + " cannot scale it)");
  }
  cpu::WeightMatrix m{int8_weights_ ? DType::kI8 : DType::kF8E4M3, codes, rows, cols};
  m.scales = scales;
  return m;
}

cpu::WeightMatrix CpuModel::Packed(const cpu::WeightMatrix& m) {
  if (m.packed) return m;
  if (m.dtype == DType::kI8 && cpu::Int8KernelWantsPacked()) {
    return cpu::PackInt8(m, AllocateWeights(size_t(cpu::Int8PackedBytes(m.rows, m.cols))));
  }
  if ((m.dtype == DType::kBF16 || m.dtype == DType::kF16) && cpu::HalfKernelWantsPacked()) {
    return cpu::PackHalf(m, AllocateWeights(size_t(cpu::HalfPackedBytes(m.rows, m.cols))));
  }
  return m;
}

std::string CpuModel::WeightsDescription() const {
  const std::string base(DTypeName(weight_dtype_));
  if (int8_weights_) {
    return std::string("I8 (linear layers, per-row scales; activations per block of 32, ") +
           cpu::Int8KernelName(cpu::BestInt8Kernel()) + " kernel) + " + base;
  }
  return fp8_weights_ ? "F8_E4M3 (linear layers, per-row scales) + " + base : base;
}

std::vector<float> CpuModel::Vector(const std::string& name, int64_t size) {
  const TensorView& t = checkpoint_->GetWithShape(name, {size});
  std::vector<float> out(static_cast<size_t>(size));
  ToF32(t, out.data(), size);
  return out;
}

// A forward pass allocates its activations (a few MiB each at a 512-token prompt) and frees
// them; glibc serves blocks that large from fresh mappings (and returns the heap's top to the
// system), so every pass paid page faults and zeroing for them: 10-20% of prompt processing
// (llama2.c 110M shape, 2 threads, AMD EPYC dev VM, 2026-12-05: ~570 -> ~750 tok/s without).
// Blocks up to 256 MiB come from the heap instead and freed memory stays there, for the next
// pass to reuse (the process keeps its peak, as every inference server does).
static void KeepActivationsInTheHeap() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  });
}

std::unique_ptr<CpuModel> CpuModel::Load(const std::string& model_dir, const LoadOptions& options) {
  KeepActivationsInTheHeap();
  std::unique_ptr<CpuModel> m(new CpuModel());
  m->config_ = ModelConfig::Load(model_dir);
  const ArchitectureSpec& spec = ArchitectureOf(m->config_);
  RequireBackendSupport(m->config_, spec, kCpuBackendSupport);
  m->checkpoint_ = Checkpoint::Open(model_dir);
  ValidateCheckpoint(m->config_, *m->checkpoint_);
  const ModelConfig& c = m->config_;
  const TensorView& embed = m->checkpoint_->Get(WeightName(WeightOf(spec, WeightRole::kEmbed), -1));
  m->weight_dtype_ = options.weight_dtype.value_or(embed.dtype);
  if (options.fp8_weights && options.int8_weights) {
    throw Error("--quantization: fp8 and int8 weights exclude each other");
  }
  m->fp8_weights_ = options.fp8_weights;
  m->int8_weights_ = options.int8_weights;

  // Every weight of the registry's list, by role; a tied lm_head (absent from the checkpoint)
  // is the embedding matrix.
  m->layers_.resize(static_cast<size_t>(c.num_layers));
  bool has_head = false;
  const bool offset_norms = spec.features.norm == NormStyle::kRmsNormOffset;
  auto load = [&](const WeightSpec& w, int64_t layer, int64_t expert) {
    const std::string name = WeightName(w, layer, expert);
    const std::vector<int64_t> shape = WeightShape(w, c);
    if (w.role == WeightRole::kLmHead) {
      has_head = m->checkpoint_->Find(name) != nullptr;
      if (c.tie_word_embeddings && !has_head) return;
    }
    if (w.cols == Dim::kNone) {
      std::vector<float> v = m->Vector(name, shape[0]);
      if (offset_norms && !IsBias(w.role)) {
        for (float& x : v) x += 1.f;  // Gemma: x / rms(x) · (1 + w), in fp32 as transformers
      }
      *m->VectorOf(w.role, layer) = std::move(v);
      return;
    }
    // int8 quantizes lm_head too, as llama.cpp's Q8_0 does (a sixteenth of the bytes a token
    // reads at this shape); fp8 keeps it, as vLLM does.
    const bool quantize = w.is_linear || (m->int8_weights_ && w.role == WeightRole::kLmHead);
    const cpu::WeightMatrix matrix =
        quantize ? m->LinearMatrix(name, shape) : m->Matrix(name, shape);
    Layer* l = layer >= 0 ? &m->layers_[static_cast<size_t>(layer)] : nullptr;
    if (w.role == WeightRole::kQkvProj) {  // Phi-3: rows q | k | v of one matrix
      const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
      l->q = m->Packed(RowRange(matrix, 0, q_dim));
      l->k = m->Packed(RowRange(matrix, q_dim, kv_dim));
      l->v = m->Packed(RowRange(matrix, q_dim + kv_dim, kv_dim));
    } else if (w.role == WeightRole::kGateUpProj) {  // rows gate | up
      l->gate = m->Packed(RowRange(matrix, 0, c.intermediate_size));
      l->up = m->Packed(RowRange(matrix, c.intermediate_size, c.intermediate_size));
    } else {
      *m->MatrixOf(w.role, layer, expert) = m->Packed(matrix);
    }
  };
  for (const WeightSpec& w : spec.weights) {
    if (!w.per_layer) load(w, -1, -1);
  }
  if (c.tie_word_embeddings && !has_head) {
    const WeightSpec& e = WeightOf(spec, WeightRole::kEmbed);
    // int8: an int8 copy of the tied table for lm_head; the lookups keep the table.
    m->lm_head_ = m->int8_weights_
                      ? m->Packed(m->LinearMatrix(WeightName(e, -1), WeightShape(e, c)))
                      : m->embed_;
  }
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& l = m->layers_[static_cast<size_t>(i)];
    l.moe = c.IsMoeLayer(i);
    if (l.moe) {
      for (auto* experts : {&l.expert_gate, &l.expert_up, &l.expert_down}) {
        experts->resize(static_cast<size_t>(c.num_experts));
      }
    }
    for (const WeightSpec& w : spec.weights) {
      if (!w.per_layer || !LayerHolds(w, c, i)) continue;
      for (int64_t e = 0; e < (w.per_expert ? c.num_experts : 1); ++e) {
        load(w, i, w.per_expert ? e : -1);
      }
    }
  }
  m->staging_ = {};
  m->staging16_ = {};
  m->features_ = spec.features;
  m->inv_freq_ = RopeInvFreq(c);
  if (c.sliding_rope) m->sliding_inv_freq_ = RopeInvFreq(*c.sliding_rope, c.head_dim);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& l = m->layers_[static_cast<size_t>(i)];
    l.sliding_window = c.SlidingWindowOf(i);
    l.inv_freq = c.sliding_rope && l.sliding_window > 0 ? &m->sliding_inv_freq_ : &m->inv_freq_;
  }
  return m;
}

cpu::WeightMatrix* CpuModel::MatrixOf(WeightRole role, int64_t layer, int64_t expert) {
  switch (role) {
    case WeightRole::kEmbed:
      return &embed_;
    case WeightRole::kLmHead:
      return &lm_head_;
    default:
      break;
  }
  Layer& l = layers_.at(static_cast<size_t>(layer));
  switch (role) {
    case WeightRole::kQProj:
      return &l.q;
    case WeightRole::kKProj:
      return &l.k;
    case WeightRole::kVProj:
      return &l.v;
    case WeightRole::kOProj:
      return &l.o;
    case WeightRole::kGateProj:
      return &l.gate;
    case WeightRole::kUpProj:
      return &l.up;
    case WeightRole::kDownProj:
      return &l.down;
    case WeightRole::kRouter:
      return &l.router;
    case WeightRole::kExpertGate:
      return &l.expert_gate.at(static_cast<size_t>(expert));
    case WeightRole::kExpertUp:
      return &l.expert_up.at(static_cast<size_t>(expert));
    case WeightRole::kExpertDown:
      return &l.expert_down.at(static_cast<size_t>(expert));
    default:
      throw std::logic_error("CpuModel: weight role " + std::to_string(static_cast<int>(role)) +
                             " is not a matrix");
  }
}

std::vector<float>* CpuModel::VectorOf(WeightRole role, int64_t layer) {
  if (role == WeightRole::kFinalNorm) return &final_norm_;
  Layer& l = layers_.at(static_cast<size_t>(layer));
  switch (role) {
    case WeightRole::kInputNorm:
      return &l.input_norm;
    case WeightRole::kPostAttentionNorm:
      return &l.post_attention_norm;
    case WeightRole::kQBias:
      return &l.q_bias;
    case WeightRole::kKBias:
      return &l.k_bias;
    case WeightRole::kVBias:
      return &l.v_bias;
    case WeightRole::kQNorm:
      return &l.q_norm;
    case WeightRole::kKNorm:
      return &l.k_norm;
    case WeightRole::kAttnOutputNorm:
      return &l.attn_out_norm;
    case WeightRole::kMlpOutputNorm:
      return &l.mlp_out_norm;
    default:
      throw std::logic_error("CpuModel: weight role " + std::to_string(static_cast<int>(role)) +
                             " is not a vector");
  }
}

int64_t CpuModel::weight_bytes_per_token() const {
  int64_t bytes = lm_head_.num_bytes();
  for (const Layer& l : layers_) {
    for (const cpu::WeightMatrix* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) {
      bytes += w->num_bytes();
    }
    if (l.moe) {  // the router and k experts (all experts are the same size)
      bytes += l.router.num_bytes() + config_.num_experts_per_tok * (l.expert_gate[0].num_bytes() +
                                                                     l.expert_up[0].num_bytes() +
                                                                     l.expert_down[0].num_bytes());
    }
  }
  return bytes;
}

void CpuModel::Attention(const Layer& layer, int64_t layer_index, const float* normed, float* out,
                         const ForwardBatch& batch, KvCachePool& kv) const {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens();
  const int64_t q_dim = c.num_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  std::vector<float> q(static_cast<size_t>(n * q_dim)), k(static_cast<size_t>(n * kv_dim)),
      v(static_cast<size_t>(n * kv_dim)), attn(static_cast<size_t>(n * q_dim));
  cpu::Linear(normed, layer.q, q.data(), n);
  cpu::Linear(normed, layer.k, k.data(), n);
  cpu::Linear(normed, layer.v, v.data(), n);
  if (features_.attention_bias) {
    cpu::AddBias(q.data(), layer.q_bias.data(), n, q_dim);
    cpu::AddBias(k.data(), layer.k_bias.data(), n, kv_dim);
    cpu::AddBias(v.data(), layer.v_bias.data(), n, kv_dim);
  }
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (features_.qk_norm) {  // each head's row normalized on its own
    cpu::RmsNorm(q.data(), layer.q_norm.data(), q.data(), n * c.num_heads, c.head_dim, eps);
    cpu::RmsNorm(k.data(), layer.k_norm.data(), k.data(), n * c.num_kv_heads, c.head_dim, eps);
  }
  const float* inv_freq = layer.inv_freq->data();
  cpu::ApplyRope(q.data(), n, c.num_heads, c.head_dim, batch.positions.data(), inv_freq);
  cpu::ApplyRope(k.data(), n, c.num_kv_heads, c.head_dim, batch.positions.data(), inv_freq);
  // fp32 pools, or fp8 pools (--kv-cache-dtype fp8: quantized on append, dequantized tile by
  // tile inside the attention kernels).
  const bool fp8 = kv.dtype() == KvCacheDType::kFp8E4m3;
  PagedKvView<float> layer_kv{};
  PagedKvView<uint8_t> layer_kv8{};
  if (fp8) {
    layer_kv8 = kv.Fp8Layer(layer_index);
    cpu::AppendKv(k.data(), v.data(), batch.slot_mapping.data(), n, layer_kv8, kv.fp8_scales());
  } else {
    layer_kv = kv.Layer(layer_index);
    cpu::AppendKv(k.data(), v.data(), batch.slot_mapping.data(), n, layer_kv);
  }
  const PagedKvView<const float> read_kv{layer_kv.k, layer_kv.v, layer_kv.layout};
  const PagedKvView<const uint8_t> read_kv8{layer_kv8.k, layer_kv8.v, layer_kv8.layout};
  const float scale = c.AttentionScale();
  // Batch-invariant mode runs decode tokens through the prefill kernel too: one code path
  // per query row, so a token's logits are bit-identical alone, batched, chunked or
  // recomputed after preemption (the split-KV decode kernel merges partial softmax states
  // in a different order than a straight pass).
  const int64_t num_decode = batch.is_batch_invariant ? 0 : batch.num_decode_seqs;
  if (num_decode > 0) {
    AttentionBatch decode{num_decode,
                          batch.cu_seqlens_q.data(),
                          batch.context_lens.data(),
                          batch.block_tables.data(),
                          batch.max_blocks_per_seq,
                          layer.sliding_window};
    if (fp8) {
      cpu::PagedDecodeAttention(q.data(), read_kv8, kv.fp8_scales(), decode, c.num_heads, scale,
                                attn.data());
    } else {
      cpu::PagedDecodeAttention(q.data(), read_kv, decode, c.num_heads, scale, attn.data());
    }
  }
  if (batch.num_seqs() > num_decode) {
    // The prefill chunks follow the decode tokens: rebase their query offsets to 0.
    std::vector<int32_t> cu(batch.cu_seqlens_q.begin() + num_decode, batch.cu_seqlens_q.end());
    for (int32_t& x : cu) x -= static_cast<int32_t>(num_decode);
    AttentionBatch prefill{batch.num_seqs() - num_decode,
                           cu.data(),
                           batch.context_lens.data() + num_decode,
                           batch.block_tables.data() + num_decode * batch.max_blocks_per_seq,
                           batch.max_blocks_per_seq,
                           layer.sliding_window};
    if (fp8) {
      cpu::PagedPrefillAttention(q.data() + num_decode * q_dim, read_kv8, kv.fp8_scales(), prefill,
                                 c.num_heads, scale, attn.data() + num_decode * q_dim);
    } else {
      cpu::PagedPrefillAttention(q.data() + num_decode * q_dim, read_kv, prefill, c.num_heads,
                                 scale, attn.data() + num_decode * q_dim);
    }
  }
  cpu::Linear(attn.data(), layer.o, out, n);
  if (features_.sandwich_norms) {
    cpu::RmsNorm(out, layer.attn_out_norm.data(), out, n, c.hidden_size, eps);
  }
}

void CpuModel::Mlp(const Layer& layer, int64_t layer_index, const float* normed, float* out,
                   int64_t num_tokens) const {
  if (layer.moe) {
    MoeMlp(layer, layer_index, normed, out, num_tokens);
    return;
  }
  const int64_t inter = config_.intermediate_size;
  std::vector<float> gate(static_cast<size_t>(num_tokens * inter));
  std::vector<float> up(static_cast<size_t>(num_tokens * inter));
  cpu::Linear(normed, layer.gate, gate.data(), num_tokens);
  cpu::Linear(normed, layer.up, up.data(), num_tokens);
  if (features_.mlp == MlpKind::kGeGluTanh) {
    cpu::GeluTanhMul(gate.data(), up.data(), gate.data(), num_tokens * inter);
  } else {
    cpu::SiluMul(gate.data(), up.data(), gate.data(), num_tokens * inter);
  }
  cpu::Linear(gate.data(), layer.down, out, num_tokens);
  if (features_.sandwich_norms) {
    cpu::RmsNorm(out, layer.mlp_out_norm.data(), out, num_tokens, config_.hidden_size,
                 static_cast<float>(config_.rms_norm_eps));
  }
}

// As transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock: the router's top k per
// token, then expert by expert (ascending) its SwiGLU over the rows of the tokens that chose
// it, each scaled by its routing weight and added into the token's output. A token's output
// depends only on its own row: batch-invariant.
void CpuModel::MoeMlp(const Layer& layer, int64_t layer_index, const float* normed, float* out,
                      int64_t n) const {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  const int64_t num_experts = c.num_experts, k = c.num_experts_per_tok;
  std::vector<float> logits(static_cast<size_t>(n * num_experts));
  cpu::Linear(normed, layer.router, logits.data(), n);
  std::vector<int32_t> chosen(static_cast<size_t>(n * k));
  std::vector<float> weights(static_cast<size_t>(n * k));
  cpu::MoeRoute(logits.data(), n, num_experts, k, c.norm_topk_prob, chosen.data(), weights.data());
  if (routing_observer_) routing_observer_(layer_index, chosen);
  const cpu::ExpertGroups groups =
      cpu::GroupByExpert(chosen.data(), weights.data(), n, k, num_experts);
  std::fill(out, out + n * hidden, 0.f);
  std::vector<float> x, gate, up, down;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t begin = groups.offsets[size_t(e)], m = groups.offsets[size_t(e + 1)] - begin;
    if (m == 0) continue;
    x.resize(static_cast<size_t>(m * hidden));
    for (int64_t r = 0; r < m; ++r) {
      const float* src = normed + int64_t(groups.tokens[size_t(begin + r)]) * hidden;
      std::copy(src, src + hidden, x.data() + r * hidden);
    }
    gate.resize(static_cast<size_t>(m * inter));
    up.resize(gate.size());
    down.resize(x.size());
    cpu::Linear(x.data(), layer.expert_gate[size_t(e)], gate.data(), m);
    cpu::Linear(x.data(), layer.expert_up[size_t(e)], up.data(), m);
    cpu::SiluMul(gate.data(), up.data(), gate.data(), m * inter);
    cpu::Linear(gate.data(), layer.expert_down[size_t(e)], down.data(), m);
    for (int64_t r = 0; r < m; ++r) {
      float* dst = out + int64_t(groups.tokens[size_t(begin + r)]) * hidden;
      const float w = groups.weights[size_t(begin + r)];
      for (int64_t j = 0; j < hidden; ++j) dst[j] += down[size_t(r * hidden + j)] * w;
    }
  }
}

std::vector<float> CpuModel::Forward(const ForwardBatch& batch, KvCachePool& kv) const {
  const ModelConfig& c = config_;
  const int64_t n = batch.num_tokens(), hidden = c.hidden_size;
  if (n == 0) throw Error("Forward: no tokens");
  if (batch.has_fed_tokens()) {
    throw std::logic_error("CpuModel::Forward: fed tokens (ModelExecutor::Launch resolves them)");
  }
  std::vector<float> x(static_cast<size_t>(n * hidden));
  for (int64_t t = 0; t < n; ++t) {
    const int id = batch.token_ids[static_cast<size_t>(t)];
    if (id < 0 || id >= c.vocab_size) {
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(c.vocab_size) + ")");
    }
    cpu::LoadRow(embed_, id, x.data() + t * hidden);
  }
  if (features_.scale_embeddings) {  // Gemma: × sqrt(hidden), rounded to float as transformers
    const float s = static_cast<float>(std::sqrt(static_cast<double>(hidden)));
    for (float& v : x) v *= s;
  }
  std::vector<float> normed(x.size()), delta(x.size());
  const float eps = static_cast<float>(c.rms_norm_eps);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const Layer& layer = layers_[static_cast<size_t>(i)];
    cpu::RmsNorm(x.data(), layer.input_norm.data(), normed.data(), n, hidden, eps);
    Attention(layer, i, normed.data(), delta.data(), batch, kv);
    cpu::AddInPlace(x.data(), delta.data(), n * hidden);
    cpu::RmsNorm(x.data(), layer.post_attention_norm.data(), normed.data(), n, hidden, eps);
    Mlp(layer, i, normed.data(), delta.data(), n);
    cpu::AddInPlace(x.data(), delta.data(), n * hidden);
  }
  // Final norm and lm_head only for the rows that need logits.
  const int64_t num_out = static_cast<int64_t>(batch.logits_indices.size());
  std::vector<float> rows(static_cast<size_t>(num_out * hidden));
  for (int64_t r = 0; r < num_out; ++r) {
    const float* src = x.data() + batch.logits_indices[static_cast<size_t>(r)] * hidden;
    std::copy(src, src + hidden, rows.data() + r * hidden);
  }
  cpu::RmsNorm(rows.data(), final_norm_.data(), rows.data(), num_out, hidden, eps);
  std::vector<float> logits(static_cast<size_t>(num_out * c.vocab_size));
  cpu::Linear(rows.data(), lm_head_, logits.data(), num_out);
  return logits;
}

}  // namespace llm
