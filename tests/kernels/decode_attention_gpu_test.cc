// GPU paged decode attention and KV append against the CPU references (label gpu; skips
// without a GPU). kernels/cuda/decode_attention.{h,cu}, kernels/cuda/kv_append.cu.
//
// Error bound: the CPU reference runs in fp32 on the SAME bf16/fp16-rounded q, K, V, so the
// only differences are the kernel's own roundings: P (the softmax weights, in [0, 1]) is
// rounded to the input precision before the P·V tensor-core product (relative 2^-9 for bf16,
// 2^-11 for fp16, per weight, so at most that relative error of max|v| ≈ max|out| scale in
// the weighted sum), and the output is rounded once to the input precision (another 2^-9 /
// 2^-11 of |out|); fp32 accumulation order differences are ~1e-6. A naive same-precision
// kernel (bf16 output) already carries the output rounding, 2^-9 ≈ 2e-3 of max|ref|. The
// bound used, max abs err ≤ 2e-2 · max|ref| (bf16) and 4e-3 · max|ref| (fp16), is ~5× the
// sum of those two terms: tight enough that a wrong key, a dropped tile, a missing rescale
// or a bad merge (errors of order max|ref|) fail, loose enough for rounding.
//
// Poisons: the output is NaN before each run; pool slots no sequence owns (tail of a
// partially filled block, unreferenced blocks) hold NaN on the GPU (0 for the CPU), so a
// kernel that reads past a sequence's end or through a wrong page shows NaN.
//   ninja -C build decode_attention_gpu_test && (cd build && ctest -L gpu -R decode_attention)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/dtype.h"

namespace llm {
namespace {

bool GpuAvailable(std::string* why) { return cuda::DeviceAvailable(why); }

uint16_t ToBits(float x, DType t) { return t == DType::kBF16 ? F32ToBf16(x) : F32ToF16(x); }
float FromBits(uint16_t h, DType t) { return t == DType::kBF16 ? Bf16ToF32(h) : F16ToF32(h); }
uint16_t NanBits(DType t) { return t == DType::kBF16 ? 0x7fc0 : 0x7e00; }

// RAII device buffer.
struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(size_t bytes) {
    if (bytes) LLM_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  template <typename T>
  static void Upload(const DevBuf& b, const std::vector<T>& h) {
    LLM_CUDA_CHECK(cudaMemcpy(b.p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
};

struct Case {
  DType dtype;
  int head_dim;
  int group;       // query heads per kv head
  int block_size;  // tokens per block
};

std::string Name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "f16") + "_hd" +
         std::to_string(c.head_dim) + "_g" + std::to_string(c.group) + "_bs" +
         std::to_string(c.block_size);
}

class DecodeAttentionGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!GpuAvailable(&why)) GTEST_SKIP() << "no GPU, decode attention GPU test skipped: " << why;
  }
};

// Runs one random ragged batch against the CPU reference for splits 1, auto and many.
TEST_P(DecodeAttentionGpu, MatchesCpuReference) {
  const Case tc = GetParam();
  const int64_t num_kv_heads = 2;
  const int64_t num_heads = num_kv_heads * tc.group;
  const int64_t hd = tc.head_dim;
  const int64_t bs = tc.block_size;
  // Ragged: 1 key, just under / over a tile and a block, a long one, non-multiples of bs.
  const std::vector<int32_t> num_keys = {1, 63, 65, 1000 + 3, 4999, 17, 2500 + tc.block_size / 2};
  const int64_t num_seqs = static_cast<int64_t>(num_keys.size());
  std::mt19937 rng(1234 + tc.head_dim + 7 * tc.group + 13 * tc.block_size);
  std::normal_distribution<float> normal(0.f, 1.f);

  // Block tables over a shuffled pool with spare blocks (never referenced: NaN on the GPU).
  int64_t max_blocks = 0, used_blocks = 0;
  for (int32_t n : num_keys) {
    max_blocks = std::max<int64_t>(max_blocks, (n + bs - 1) / bs);
    used_blocks += (n + bs - 1) / bs;
  }
  const int64_t num_blocks = used_blocks + 7;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(num_seqs * max_blocks, -1), context_lens(num_seqs),
      cu_q(num_seqs + 1);
  PagedKvLayout layout{num_blocks, bs, num_kv_heads, hd};
  std::vector<float> k32(layout.pool_elements(), 0.f), v32(layout.pool_elements(), 0.f);
  std::vector<uint16_t> k16(k32.size(), NanBits(tc.dtype)), v16(v32.size(), NanBits(tc.dtype));
  int64_t next = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    context_lens[s] = num_keys[s] - 1;
    cu_q[s] = static_cast<int32_t>(s);
    for (int64_t b = 0; b < (num_keys[s] + bs - 1) / bs; ++b) tables[s * max_blocks + b] = perm[next++];
    for (int64_t pos = 0; pos < num_keys[s]; ++pos) {
      const int64_t block = tables[s * max_blocks + pos / bs];
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const int64_t off = layout.Offset(block, h, pos % bs);
        for (int64_t d = 0; d < hd; ++d) {
          k16[off + d] = ToBits(normal(rng), tc.dtype);
          v16[off + d] = ToBits(normal(rng), tc.dtype);
          k32[off + d] = FromBits(k16[off + d], tc.dtype);
          v32[off + d] = FromBits(v16[off + d], tc.dtype);
        }
      }
    }
  }
  cu_q[num_seqs] = static_cast<int32_t>(num_seqs);
  // Queries with a larger spread (σ = 2) so some softmax rows are peaked.
  std::vector<uint16_t> q16(num_seqs * num_heads * hd);
  std::vector<float> q32(q16.size());
  for (size_t i = 0; i < q16.size(); ++i) {
    q16[i] = ToBits(2.f * normal(rng), tc.dtype);
    q32[i] = FromBits(q16[i], tc.dtype);
  }
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));

  AttentionBatch cpu_batch{num_seqs, cu_q.data(), context_lens.data(), tables.data(), max_blocks};
  std::vector<float> ref(q32.size());
  cpu::PagedDecodeAttention(q32.data(), PagedKvView<const float>{k32.data(), v32.data(), layout},
                            cpu_batch, num_heads, scale, ref.data(), 1);
  float max_ref = 0.f;
  for (float r : ref) max_ref = std::max(max_ref, std::fabs(r));

  DevBuf dq(q16.size() * 2), dout(q16.size() * 2), dk(k16.size() * 2), dv(v16.size() * 2),
      dtables(tables.size() * 4), dctx(context_lens.size() * 4), dcu(cu_q.size() * 4);
  DevBuf::Upload(dq, q16);
  DevBuf::Upload(dk, k16);
  DevBuf::Upload(dv, v16);
  DevBuf::Upload(dtables, tables);
  DevBuf::Upload(dctx, context_lens);
  DevBuf::Upload(dcu, cu_q);
  const int kManySplits = 64;
  const size_t ws_bytes = cuda::DecodeWorkspaceBytes(num_seqs, num_heads, hd, kManySplits);
  DevBuf ws(ws_bytes);

  cuda::AttentionParams p;
  p.q = dq.p;
  p.out = dout.p;
  p.kv = PagedKvView<const void>{dk.p, dv.p, layout};
  p.batch = AttentionBatch{num_seqs, static_cast<const int32_t*>(dcu.p),
                           static_cast<const int32_t*>(dctx.p),
                           static_cast<const int32_t*>(dtables.p), max_blocks};
  p.num_heads = num_heads;
  p.scale = scale;
  p.dtype = tc.dtype;
  p.max_q_len = 1;
  p.max_num_keys = *std::max_element(num_keys.begin(), num_keys.end());

  const float tol = (tc.dtype == DType::kBF16 ? 2e-2f : 4e-3f) * max_ref;
  for (int splits : {1, 0, 5, kManySplits}) {
    std::vector<uint16_t> got(q16.size(), NanBits(tc.dtype));
    DevBuf::Upload(dout, got);  // poison
    cuda::DecodeLaunchInfo info;
    cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, nullptr, &info);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    LLM_CUDA_CHECK(cudaMemcpy(got.data(), dout.p, got.size() * 2, cudaMemcpyDeviceToHost));
    float max_err = 0.f;
    int64_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float g = FromBits(got[i], tc.dtype);
      ASSERT_FALSE(std::isnan(g)) << "splits " << splits << " element " << i;
      const float e = std::fabs(g - ref[i]);
      if (e > max_err) {
        max_err = e;
        worst = static_cast<int64_t>(i);
      }
    }
    EXPECT_LE(max_err, tol) << "splits requested " << splits << " used " << info.num_splits
                            << ", worst element " << worst << " (seq " << worst / (num_heads * hd)
                            << "), max|ref| " << max_ref;
    if (splits == kManySplits) {
      EXPECT_GT(info.num_splits, 1);
    }
    if (splits == 1) {
      EXPECT_EQ(info.num_splits, 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DecodeAttentionGpu,
    ::testing::Values(Case{DType::kBF16, 128, 4, 16}, Case{DType::kBF16, 128, 8, 32},
                      Case{DType::kBF16, 128, 1, 8}, Case{DType::kBF16, 64, 4, 8},
                      Case{DType::kBF16, 64, 8, 16}, Case{DType::kF16, 128, 4, 16},
                      Case{DType::kF16, 128, 1, 32}, Case{DType::kF16, 64, 8, 8},
                      Case{DType::kBF16, 128, 16, 16}, Case{DType::kBF16, 128, 4, 3}),
    Name);

TEST(DecodeAttentionGpuArgs, RejectsUnsupportedShapes) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  cuda::AttentionParams p;
  p.kv.layout = PagedKvLayout{1, 16, 1, 96};
  p.num_heads = 1;
  p.batch.num_seqs = 1;
  p.max_num_keys = 1;
  try {
    cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr);
    FAIL() << "head_dim 96 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("96"), std::string::npos) << e.what();
  }
  p.kv.layout.head_dim = 128;
  p.dtype = DType::kF32;
  try {
    cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr);
    FAIL() << "F32 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("F32"), std::string::npos) << e.what();
  }
}

// AppendKv against cpu::AppendKv: 16-byte path (hd 128 bf16, hd 64 f32) and the 2-byte
// fallback (hd 6 f16, 12-byte rows); negative slots skip; untouched slots keep their value.
TEST(AppendKvGpu, MatchesCpuAppend) {
  std::string why;
  if (!GpuAvailable(&why)) GTEST_SKIP() << "no GPU, AppendKv GPU test skipped: " << why;
  struct C {
    DType dtype;
    int64_t hd;
  };
  for (C c : {C{DType::kBF16, 128}, C{DType::kF32, 64}, C{DType::kF16, 6}}) {
    std::mt19937 rng(99 + c.hd);
    std::normal_distribution<float> normal(0.f, 1.f);
    const PagedKvLayout layout{9, 16, 3, c.hd};
    const int64_t num_tokens = 40;
    std::vector<int64_t> slots(num_tokens);
    std::vector<int64_t> all(layout.num_blocks * layout.block_size);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int64_t t = 0; t < num_tokens; ++t) slots[t] = t % 7 == 3 ? -1 : all[t];
    const size_t row = layout.num_kv_heads * c.hd;
    const size_t es = DTypeSize(c.dtype);
    // Host values as float (exact in every dtype after rounding) and as raw bytes.
    auto round = [&](float x) {
      return c.dtype == DType::kF32 ? x : FromBits(ToBits(x, c.dtype), c.dtype);
    };
    auto to_bytes = [&](const std::vector<float>& f) {
      std::vector<uint8_t> b(f.size() * es);
      for (size_t i = 0; i < f.size(); ++i) {
        if (c.dtype == DType::kF32) {
          std::memcpy(&b[i * 4], &f[i], 4);
        } else {
          const uint16_t h = ToBits(f[i], c.dtype);
          std::memcpy(&b[i * 2], &h, 2);
        }
      }
      return b;
    };
    auto from_bytes = [&](const std::vector<uint8_t>& b) {
      std::vector<float> f(b.size() / es);
      for (size_t i = 0; i < f.size(); ++i) {
        if (c.dtype == DType::kF32) {
          std::memcpy(&f[i], &b[i * 4], 4);
        } else {
          uint16_t h;
          std::memcpy(&h, &b[i * 2], 2);
          f[i] = FromBits(h, c.dtype);
        }
      }
      return f;
    };
    std::vector<float> k(num_tokens * row), v(num_tokens * row);
    std::vector<float> kc(layout.pool_elements()), vc(layout.pool_elements());
    for (float& x : k) x = round(normal(rng));
    for (float& x : v) x = round(normal(rng));
    for (float& x : kc) x = round(normal(rng));
    for (float& x : vc) x = round(normal(rng));
    const auto kb = to_bytes(k), vb = to_bytes(v), kcb = to_bytes(kc), vcb = to_bytes(vc);
    DevBuf dk(kb.size()), dv(vb.size()), dkc(kcb.size()), dvc(vcb.size()),
        dslots(slots.size() * 8);
    DevBuf::Upload(dk, kb);
    DevBuf::Upload(dv, vb);
    DevBuf::Upload(dkc, kcb);
    DevBuf::Upload(dvc, vcb);
    DevBuf::Upload(dslots, slots);
    cuda::AppendKv(dk.p, dv.p, static_cast<const int64_t*>(dslots.p), num_tokens,
                   PagedKvView<void>{dkc.p, dvc.p, layout}, c.dtype, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    cpu::AppendKv(k.data(), v.data(), slots.data(), num_tokens,
                  PagedKvView<float>{kc.data(), vc.data(), layout});
    std::vector<uint8_t> got_k(kcb.size()), got_v(vcb.size());
    LLM_CUDA_CHECK(cudaMemcpy(got_k.data(), dkc.p, got_k.size(), cudaMemcpyDeviceToHost));
    LLM_CUDA_CHECK(cudaMemcpy(got_v.data(), dvc.p, got_v.size(), cudaMemcpyDeviceToHost));
    EXPECT_EQ(from_bytes(got_k), kc) << DTypeName(c.dtype) << " hd " << c.hd;
    EXPECT_EQ(from_bytes(got_v), vc) << DTypeName(c.dtype) << " hd " << c.hd;
  }
}

}  // namespace
}  // namespace llm
