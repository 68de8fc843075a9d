// The worker's weights: device buffers laid out by the architecture registry's fused matrices
// (engine/model/architecture.h), uploaded from a checkpoint (this rank's tensor-parallel slice,
// converted on the host when the dtype differs), quantized to fp8 on the device at load, or
// generated as dummy values.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cuda/cuda_worker.h"
#include "engine/loader/checkpoint_check.h"
#include "engine/model/rope.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/common/fill.h"

namespace llm {

// Converts `count` elements of a checkpoint tensor to `to` (f32 or dtype) on the host in
// chunks and uploads them to dst.
void CudaWorker::Upload(const TensorView& t, int64_t count, DType to, void* dst) {
  if (t.dtype == to) {
    LLM_CUDA_CHECK(cudaMemcpy(dst, t.data, size_t(count) * DTypeSize(to), cudaMemcpyHostToDevice));
    return;
  }
  constexpr int64_t kChunk = int64_t{1} << 22;
  std::vector<float> f(size_t(std::min(count, kChunk)));
  std::vector<uint16_t> h(f.size());
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t len = std::min(kChunk, count - begin);
    const cpu::WeightMatrix m{t.dtype, t.data + begin * int64_t(DTypeSize(t.dtype)), 1, len};
    cpu::LoadRow(m, 0, f.data());
    std::byte* out = static_cast<std::byte*>(dst) + begin * int64_t(DTypeSize(to));
    if (to == DType::kF32) {
      LLM_CUDA_CHECK(cudaMemcpy(out, f.data(), size_t(len) * 4, cudaMemcpyHostToDevice));
      continue;
    }
    for (int64_t i = 0; i < len; ++i)
      h[size_t(i)] = to == DType::kBF16 ? F32ToBf16(f[size_t(i)]) : F32ToF16(f[size_t(i)]);
    LLM_CUDA_CHECK(cudaMemcpy(out, h.data(), size_t(len) * 2, cudaMemcpyHostToDevice));
  }
}

// Uploads `slice` of a checkpoint matrix with `cols` columns (the whole tensor at N = 1).
void CudaWorker::UploadSlice(const TensorView& t, int64_t cols, const TpSlice& sl, DType to,
                             void* dst) {
  const int64_t count = sl.num_rows * sl.num_cols;
  if (count == t.num_elements()) return Upload(t, count, to, dst);
  const size_t es = DTypeSize(t.dtype);
  if (t.dtype == to) {
    LLM_CUDA_CHECK(cudaMemcpy2D(
        dst, size_t(sl.num_cols) * es,
        t.data + (size_t(sl.row_begin) * size_t(cols) + size_t(sl.col_begin)) * es,
        size_t(cols) * es, size_t(sl.num_cols) * es, size_t(sl.num_rows), cudaMemcpyHostToDevice));
    return;
  }
  std::vector<std::byte> host(size_t(count) * es);
  CopySlice(t.data, cols, sl, es, host.data());
  TensorView part = t;
  part.data = host.data();
  Upload(part, count, to, dst);
}

void CudaWorker::AllocWeights() {
  const ModelConfig& c = config;
  auto vec = [&](int64_t n) {
    weight_bytes += n * 4;
    return Alloc<float>(n * 4);
  };
  auto matrix = [&](int64_t rows, int64_t cols, size_t es) {
    weight_bytes += rows * cols * int64_t(es);
    return Alloc(rows * cols * int64_t(es));
  };
  // A linear layer's matrix (e4m3 under fp8, with its row scales).
  auto linear = [&](int64_t rows, int64_t cols, float** scales) {
    if (fp8) *scales = vec(rows);
    return matrix(rows, cols, wesize);
  };
  embed = matrix(vocab, hidden, esize);
  lm_head = c.tie_word_embeddings ? embed : nullptr;
  final_norm = vec(hidden);
  layers.resize(size_t(c.num_layers));
  const ArchitectureFeatures& f = features;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& l = layers[size_t(i)];
    l.input_norm = vec(hidden);
    l.post_norm = vec(hidden);
    if (f.sandwich_norms) {
      l.attn_out_norm = vec(hidden);
      l.mlp_out_norm = vec(hidden);
    }
    if (f.attention_bias) l.qkv_bias = vec(qkv_dim);
    if (f.qk_norm) {
      l.q_norm = vec(c.head_dim);
      l.k_norm = vec(c.head_dim);
    }
    l.qkv = linear(qkv_dim, hidden, &l.qkv_s);
    l.o = linear(hidden, q_dim, &l.o_s);
    l.moe = c.IsMoeLayer(i);
    if (l.moe) {  // the router in dtype (as the CPU backend keeps it), the experts linear
      l.router = matrix(num_experts, hidden, esize);
      l.experts_gate_up = linear(num_experts * 2 * moe_inter, hidden, &l.experts_gate_up_s);
      l.experts_down = linear(num_experts * hidden, moe_inter, &l.experts_down_s);
      continue;
    }
    l.gate_up = linear(2 * inter, hidden, &l.gate_up_s);
    l.down = linear(hidden, inter, &l.down_s);
  }
  auto table = [&](const std::vector<float>& freqs) {
    float* d = Alloc<float>(int64_t(freqs.size()) * 4);
    LLM_CUDA_CHECK(cudaMemcpy(d, freqs.data(), freqs.size() * 4, cudaMemcpyHostToDevice));
    return d;
  };
  inv_freq = table(RopeInvFreq(c));
  if (c.sliding_rope) sliding_inv_freq = table(RopeInvFreq(*c.sliding_rope, c.head_dim));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    layers[size_t(i)].inv_freq =
        sliding_inv_freq && c.SlidingWindowOf(i) > 0 ? sliding_inv_freq : inv_freq;
  }
  if (f.scale_embeddings) {  // transformers multiplies by sqrt(hidden) cast to the weights' dtype
    const float s = float(std::sqrt(double(hidden)));
    embed_scale = dtype == DType::kBF16 ? Bf16ToF32(F32ToBf16(s)) : F16ToF32(F32ToF16(s));
  }
}

std::string CudaWorker::WeightsName() const {
  return fp8 ? "fp8 e4m3 linear layers with per-row scales, " + std::string(DTypeName(dtype)) +
                   " embeddings"
             : std::string(DTypeName(dtype));
}

// --quantization fp8 at load: a staging buffer for one weight in its source precision and
// the device-side check that it is finite (one flag per tensor, read back after each).
struct CudaWorker::Fp8Stage {
  CudaWorker& m;
  void* buf = nullptr;
  int64_t bytes = 0;
  int* bad = nullptr;
  explicit Fp8Stage(CudaWorker& impl) : m(impl) {}
  Fp8Stage(const Fp8Stage&) = delete;
  Fp8Stage& operator=(const Fp8Stage&) = delete;
  ~Fp8Stage() {
    cudaFree(buf);
    cudaFree(bad);
  }
  void* Get(int64_t need) {
    if (need > bytes) {
      LLM_CUDA_CHECK(cudaDeviceSynchronize());  // the previous quantization may still read it
      cudaFree(buf);
      buf = nullptr;
      bytes = 0;
      if (cudaMalloc(&buf, size_t(need)) != cudaSuccess) {
        cudaGetLastError();
        throw Error("--quantization fp8: no GPU memory for a " + Gib(double(need)) +
                    " staging buffer to quantize the weights on GPU " + std::to_string(m.device));
      }
      bytes = need;
    }
    return buf;
  }
  // codes/scales of `rows` rows quantized from `src`; throws Error(what + ...) when a weight
  // is NaN or infinite (the CPU backend's check).
  void Quantize(const void* src, DType from, int64_t rows, int64_t cols, void* codes, float* scales,
                const std::string& what) {
    // A checkpoint's upload ran on the legacy stream (it may still be landing).
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    if (!bad) LLM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(int)));
    LLM_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), m.stream));
    cuda::QuantizeRowsE4m3(src, from, rows, cols, static_cast<uint8_t*>(codes), scales, bad,
                           m.stream);
    int h = 0;
    LLM_CUDA_CHECK(cudaMemcpyAsync(&h, bad, sizeof(int), cudaMemcpyDeviceToHost, m.stream));
    LLM_CUDA_CHECK(cudaStreamSynchronize(m.stream));
    if (h != 0) {
      throw Error(what + " holds a NaN or infinite weight (--quantization fp8 cannot scale it; " +
                  std::to_string(h) + " rows affected)");
    }
  }
};

// Where the registry's per-layer weights live on the device: a (fused) matrix with its fp8 row
// scales, and the norm vectors (the CUDA backend's layer skeleton fuses q|k|v and gate|up).
struct CudaWorker::DeviceMatrix {
  void* data = nullptr;
  float* scales = nullptr;
};

CudaWorker::DeviceMatrix CudaWorker::MatrixOf(Layer& l, const FusedMatrix& m) {
  switch (m.slot) {
    case FusedSlot::kQkv:
      return {l.qkv, l.qkv_s};
    case FusedSlot::kGateUp:
      return {l.gate_up, l.gate_up_s};
    case FusedSlot::kNone:
      break;
  }
  switch (m.members.front()->role) {
    case WeightRole::kOProj:
      return {l.o, l.o_s};
    case WeightRole::kDownProj:
      return {l.down, l.down_s};
    default:
      throw std::logic_error("CUDA executor: no device matrix for weight " +
                             std::string(m.members.front()->name));
  }
}

// Expert `e`'s gate rows then up rows in its gate|up block, one down block per expert.
CudaWorker::ExpertRows CudaWorker::ExpertMatrixOf(Layer& l, WeightRole role, int64_t e) const {
  switch (role) {
    case WeightRole::kExpertGate:
      return {l.experts_gate_up, l.experts_gate_up_s, e * 2 * moe_inter};
    case WeightRole::kExpertUp:
      return {l.experts_gate_up, l.experts_gate_up_s, e * 2 * moe_inter + moe_inter};
    case WeightRole::kExpertDown:
      return {l.experts_down, l.experts_down_s, e * hidden};
    default:
      throw std::logic_error("CUDA executor: no expert matrix for weight role " +
                             std::to_string(int(role)));
  }
}

float* CudaWorker::VectorOf(Layer& l, WeightRole role) const {
  switch (role) {
    case WeightRole::kInputNorm:
      return l.input_norm;
    case WeightRole::kPostAttentionNorm:
      return l.post_norm;
    case WeightRole::kQBias:  // this rank's rows of the fused q|k|v
      return l.qkv_bias;
    case WeightRole::kKBias:
      return l.qkv_bias + q_dim;
    case WeightRole::kVBias:
      return l.qkv_bias + q_dim + kv_dim;
    case WeightRole::kQNorm:
      return l.q_norm;
    case WeightRole::kKNorm:
      return l.k_norm;
    case WeightRole::kAttnOutputNorm:
      return l.attn_out_norm;
    case WeightRole::kMlpOutputNorm:
      return l.mlp_out_norm;
    default:
      throw std::logic_error("CUDA executor: no device vector for weight role " +
                             std::to_string(int(role)));
  }
}

void CudaWorker::LoadCheckpoint(const std::string& dir) {
  std::unique_ptr<Checkpoint> ckpt = Checkpoint::Open(dir);
  ValidateCheckpoint(config, *ckpt);
  const ModelConfig& c = config;
  const ArchitectureSpec& spec = ArchitectureOf(c);
  const std::string head_name = WeightName(WeightOf(spec, WeightRole::kLmHead), -1);
  const bool has_head = ckpt->Find(head_name) != nullptr;
  const bool head_here = shard.rank == 0;  // the other ranks compute no logits
  AllocWeights();
  if (!lm_head && head_here) lm_head = has_head ? Alloc(vocab * hidden * int64_t(esize)) : embed;
  if (lm_head && lm_head != embed) weight_bytes += vocab * hidden * int64_t(esize);
  auto put = [&](const std::string& name, std::vector<int64_t> shape, DType to, void* dst) {
    const TensorView& t = ckpt->GetWithShape(name, shape);
    Upload(t, t.num_elements(), to, dst);
  };
  // A linear layer's weight: this rank's slice of the full [rows, cols] checkpoint tensor,
  // at row `row0` of the (fused) matrix `base`. fp8: uploaded as it is stored (bf16, fp16 or
  // fp32; anything else converted to fp32) into a staging buffer and quantized on the device
  // into codes and row scales: the values the CPU backend quantizes (widening is exact), by
  // its rule (cpu::QuantizeFp8Rows), so at one GPU the codes are the CPU's bit for bit.
  Fp8Stage stage(*this);
  auto put_part = [&](const std::string& name, int64_t rows, int64_t cols, const TpSlice& sl,
                      void* base, float* scales, int64_t row0) {
    const TensorView& t = ckpt->GetWithShape(name, {rows, cols});
    if (!fp8) {
      UploadSlice(t, cols, sl, dtype,
                  static_cast<std::byte*>(base) + row0 * sl.num_cols * int64_t(esize));
      return;
    }
    const DType from = t.dtype == DType::kBF16 || t.dtype == DType::kF16 ? t.dtype : DType::kF32;
    void* src = stage.Get(sl.num_rows * sl.num_cols * int64_t(DTypeSize(from)));
    UploadSlice(t, cols, sl, from, src);
    stage.Quantize(src, from, sl.num_rows, sl.num_cols,
                   static_cast<std::byte*>(base) + row0 * sl.num_cols, scales + row0,
                   t.file + ": tensor " + name);
  };
  const WeightSpec& embed_w = WeightOf(spec, WeightRole::kEmbed);
  put(WeightName(embed_w, -1), WeightShape(embed_w, c), dtype, embed);
  if (lm_head && lm_head != embed) put(head_name, {vocab, hidden}, dtype, lm_head);
  // A vector (count elements of t from element `begin`) as fp32; Gemma's norms as 1 + w.
  const bool offset_norms = spec.features.norm == NormStyle::kRmsNormOffset;
  auto put_vector = [&](const TensorView& t, int64_t begin, int64_t count, bool is_norm,
                        float* dst) {
    std::vector<float> host(static_cast<size_t>(count));
    const cpu::WeightMatrix m{t.dtype, t.data + begin * int64_t(DTypeSize(t.dtype)), 1, count};
    cpu::LoadRow(m, 0, host.data());
    if (offset_norms && is_norm) {
      for (float& v : host) v += 1.f;
    }
    LLM_CUDA_CHECK(cudaMemcpy(dst, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  };
  const WeightSpec& norm_w = WeightOf(spec, WeightRole::kFinalNorm);
  put_vector(ckpt->GetWithShape(WeightName(norm_w, -1), WeightShape(norm_w, c)), 0, hidden, true,
             final_norm);
  const std::vector<FusedMatrix> matrices = LayerLinearMatrices(spec);
  const auto start = Clock::now();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& l = layers[size_t(i)];
    for (const FusedMatrix& m : matrices) {
      if (!LayerHolds(*m.members.front(), c, i)) continue;  // a MoE layer's dense MLP
      const DeviceMatrix d = MatrixOf(l, m);
      int64_t row0 = 0;  // members stack by rows: q|k|v, gate|up
      for (const WeightSpec* w : m.members) {
        const std::vector<int64_t> shape = WeightShape(*w, c);
        const TpSlice sl = shard.Slice(*w, c);
        put_part(WeightName(*w, i), shape[0], shape[1], sl, d.data, d.scales, row0);
        row0 += sl.num_rows;
      }
    }
    for (const WeightSpec& w : spec.weights) {
      if (!w.per_layer || !LayerHolds(w, c, i)) continue;
      if (w.role == WeightRole::kRouter) {  // whole on every rank, in dtype
        put(WeightName(w, i), WeightShape(w, c), dtype, l.router);
        continue;
      }
      if (w.per_expert) {  // this rank's slice of each expert's matrix (fp8: quantized)
        const std::vector<int64_t> shape = WeightShape(w, c);
        const TpSlice sl = shard.Slice(w, c);
        for (int64_t e = 0; e < num_experts; ++e) {
          const ExpertRows d = ExpertMatrixOf(l, w.role, e);
          put_part(WeightName(w, i, e), shape[0], shape[1], sl, d.data, d.scales, d.row0);
        }
        continue;
      }
      if (w.is_linear) continue;
      // This rank's rows of the vector (biases split by heads; norms whole).
      const std::vector<int64_t> shape = WeightShape(w, c);
      const TensorView& t = ckpt->GetWithShape(WeightName(w, i), shape);
      TpSlice sl = shard.Slice(w, c);
      if (w.tp == TpSplit::kReplicated) sl = {0, shape[0], 0, 1};
      put_vector(t, sl.row_begin, sl.num_rows, !IsBias(w.role), VectorOf(l, w.role));
    }
    if (opt.log && head_here && isatty(fileno(stderr))) {
      std::fprintf(stderr, "\r[cuda] loading weights: layer %lld/%lld", (long long)(i + 1),
                   (long long)c.num_layers);
      if (i + 1 == c.num_layers) std::fprintf(stderr, "\n");
    }
  }
  // The uploads ran on the legacy stream (a pageable cudaMemcpy may return before its DMA
  // lands); the kernels run on `stream`, which does not wait for it.
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  Log("weights: " + Gib(double(weight_bytes)) + " (" + WeightsName() + ") loaded from " + dir +
      " in " + std::to_string(secs).substr(0, 5) + " s");
}

void CudaWorker::FillDummy() {
  const ModelConfig& c = config;
  const ArchitectureSpec& spec = ArchitectureOf(c);
  const bool head_here = shard.rank == 0;  // the other ranks compute no logits
  AllocWeights();
  if (!lm_head && head_here) {
    lm_head = Alloc(vocab * hidden * int64_t(esize));
    weight_bytes += vocab * hidden * int64_t(esize);
  }
  uint64_t seed = opt.dummy_seed * 1000003 + 1;
  auto rnd = [&](void* p, int64_t count) {
    cuda::FillUniform(p, dtype, count, opt.dummy_range, seed++, stream);
  };
  auto ones = [&](float* p) { cuda::FillConstant(p, DType::kF32, hidden, 1.f, stream); };
  // A split weight: the full (fused) tensor with the seed it has at N = 1, generated into a
  // scratch buffer, of which this rank keeps its blocks (concatenated by rows, as the fused
  // q|k|v and gate|up weights are). One seed per device matrix, in the registry's order.
  const std::vector<FusedMatrix> matrices = LayerLinearMatrices(spec);
  struct Plan {
    int64_t rows = 0, cols = 0;            // the full fused tensor
    int64_t rows_here = 0, cols_here = 0;  // this rank's matrix
    std::vector<TpSlice> parts;            // this rank's blocks of the full tensor
  };
  std::vector<Plan> plans;
  int64_t most = 0;
  for (const FusedMatrix& m : matrices) {
    Plan p;
    for (const WeightSpec* w : m.members) {
      const std::vector<int64_t> shape = WeightShape(*w, c);
      TpSlice sl = shard.Slice(*w, c);
      p.rows_here += sl.num_rows;
      p.cols_here = sl.num_cols;
      sl.row_begin += p.rows;  // the member's rows within the fused tensor
      p.parts.push_back(sl);
      p.rows += shape[0];
      p.cols = shape[1];
    }
    most = std::max(most, p.rows * p.cols);
    plans.push_back(std::move(p));
  }
  // A MoE layer's experts as two tensors: every expert's gate|up [E · 2 · width, hidden] (this
  // rank's gate rows and up rows of each expert, in the device order) and down
  // [E · hidden, width] (its columns).
  Plan experts_gate_up, experts_down;
  if (num_experts > 0) {
    const int64_t width = c.moe_intermediate_size, E = num_experts;
    experts_gate_up = {E * 2 * width, hidden, E * 2 * moe_inter, hidden, {}};
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t half = 0; half < 2; ++half) {
        const int64_t first = (2 * e + half) * width + shard.rank * moe_inter;
        experts_gate_up.parts.push_back({first, moe_inter, 0, hidden});
      }
    }
    experts_down = {E * hidden,
                    width,
                    E * hidden,
                    moe_inter,
                    {TpSlice{0, E * hidden, shard.rank * moe_inter, moe_inter}}};
    most = std::max({most, E * 2 * width * hidden, E * hidden * width});
  }
  std::byte* scratch = nullptr;
  if (shard.size > 1) {
    LLM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch), size_t(most) * esize));
  }
  auto rnd_parts = [&](void* dst, const Plan& p) {
    if (!scratch) return rnd(dst, p.rows * p.cols);
    cuda::FillUniform(scratch, dtype, p.rows * p.cols, opt.dummy_range, seed++, stream);
    auto* out = static_cast<std::byte*>(dst);
    for (const TpSlice& sl : p.parts) {
      LLM_CUDA_CHECK(cudaMemcpy2DAsync(
          out, size_t(sl.num_cols) * esize,
          scratch + (size_t(sl.row_begin) * size_t(p.cols) + size_t(sl.col_begin)) * esize,
          size_t(p.cols) * esize, size_t(sl.num_cols) * esize, size_t(sl.num_rows),
          cudaMemcpyDeviceToDevice, stream));
      out += size_t(sl.num_rows * sl.num_cols) * esize;
    }
  };
  rnd(embed, vocab * hidden);
  if (lm_head != embed) {
    if (lm_head) {
      rnd(lm_head, vocab * hidden);
    } else {
      ++seed;  // rank > 0: no lm_head, the same seeds for the layers
    }
  }
  ones(final_norm);
  // fp8: this rank's matrix is generated in dtype into a staging buffer, then quantized.
  Fp8Stage stage(*this);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    Layer& l = layers[size_t(i)];
    for (const WeightSpec& w : spec.weights) {
      if (!w.per_layer || w.is_linear || w.cols != Dim::kNone || !LayerHolds(w, c, i)) continue;
      const int64_t n =
          w.tp == TpSplit::kReplicated ? DimSize(w.rows, c) : shard.Slice(w, c).num_rows;
      cuda::FillConstant(VectorOf(l, w.role), DType::kF32, n, IsBias(w.role) ? 0.f : 1.f, stream);
    }
    // A linear layer's matrix: this rank's blocks in dtype, or quantized from them.
    auto fill = [&](void* data, float* scales, const Plan& p) {
      if (!fp8) return rnd_parts(data, p);
      void* buf = stage.Get(p.rows_here * p.cols_here * int64_t(esize));
      rnd_parts(buf, p);
      stage.Quantize(buf, dtype, p.rows_here, p.cols_here, data, scales, "dummy weight");
    };
    if (l.moe) {  // the router (whole on every rank) and the experts
      rnd(l.router, num_experts * hidden);
      fill(l.experts_gate_up, l.experts_gate_up_s, experts_gate_up);
      fill(l.experts_down, l.experts_down_s, experts_down);
    }
    for (size_t k = 0; k < matrices.size(); ++k) {
      if (!LayerHolds(*matrices[k].members.front(), c, i)) continue;
      const DeviceMatrix d = MatrixOf(l, matrices[k]);
      fill(d.data, d.scales, plans[k]);
    }
  }
  LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (scratch) cudaFree(scratch);
  Log("weights: " + Gib(double(weight_bytes)) + " of dummy values (" + WeightsName() +
      ") generated on the device (seed " + std::to_string(opt.dummy_seed) + ")");
}

}  // namespace llm
