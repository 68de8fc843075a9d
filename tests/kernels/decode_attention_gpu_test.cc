// GPU paged decode attention and KV append against the CPU references (label gpu; skips
// without a GPU). kernels/cuda/attention/decode_attention.{h,cu},
// kernels/cuda/attention/kv_append.cu.
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
// kernel that reads past a sequence's end or through a wrong page shows NaN. The split
// workspace's partial area is NaN too (only its counters are zeroed, as the contract in
// decode_attention.h asks), so a merge that reads a partial this call did not write shows NaN.
//
// v3 (in-kernel split merge through per-(sequence, KV head) arrival counters, PDL): the
// counters must read zero after every call; repeated calls, CUDA graph replays and PDL on/off
// must give bit-identical outputs (the merge order is fixed: splits 0..n-1, whichever CTA
// arrives last).
//   ninja -C build decode_attention_gpu_test && (cd build && ctest -L gpu -R decode_attention)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/attention/attention.h"
#include "kernels/cuda/attention/decode_attention.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
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
    for (int64_t b = 0; b < (num_keys[s] + bs - 1) / bs; ++b)
      tables[s * max_blocks + b] = perm[next++];
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
  LLM_CUDA_CHECK(cudaMemset(ws.p, 0, ws_bytes));  // the counters start at zero (once)

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
  // head_dim 256: the automatic choice (the transposed step for groups <= 8) and kCta (the
  // original step) both, each at every split count.
  const int num_choices = hd == 256 ? 2 : 1;
  for (int run = 0; run < 4 * num_choices; ++run) {
    const int splits = std::vector<int>{1, 0, 5, kManySplits}[run % 4];
    const auto choice = run < 4 ? cuda::DecodeKernelChoice::kAuto : cuda::DecodeKernelChoice::kCta;
    std::vector<uint16_t> got(q16.size(), NanBits(tc.dtype));
    DevBuf::Upload(dout, got);  // poison
    cuda::DecodeLaunchInfo info;
    cuda::PagedDecodeAttention(p, splits, ws.p, ws_bytes, nullptr, &info, choice);
    EXPECT_EQ(info.transposed_step,
              hd == 256 && tc.group <= 8 && choice == cuda::DecodeKernelChoice::kAuto);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    LLM_CUDA_CHECK(cudaMemcpy(got.data(), dout.p, got.size() * 2, cudaMemcpyDeviceToHost));
    float max_err = 0.f;
    int64_t worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float g = FromBits(got[i], tc.dtype);
      ASSERT_FALSE(std::isnan(g)) << "splits " << splits << " run " << run << " element " << i;
      const float e = std::fabs(g - ref[i]);
      if (e > max_err) {
        max_err = e;
        worst = static_cast<int64_t>(i);
      }
    }
    EXPECT_LE(max_err, tol) << "run " << run << " splits requested " << splits << " used "
                            << info.num_splits << ", worst element " << worst << " (seq "
                            << worst / (num_heads * hd) << "), max|ref| " << max_ref;
    if (splits == kManySplits) {
      EXPECT_EQ(info.num_splits, kManySplits);  // 4999 keys: 79 tiles
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
                      Case{DType::kBF16, 128, 16, 16}, Case{DType::kBF16, 128, 4, 3},
                      // head_dim 256 (Gemma 3: GQA 2): groups 1 / 2 / 8, block sizes 16 and 5.
                      Case{DType::kBF16, 256, 2, 16}, Case{DType::kF16, 256, 1, 16},
                      Case{DType::kBF16, 256, 8, 5}, Case{DType::kF16, 256, 2, 32}),
    Name);

// ---- v3: in-kernel split merge, counters, repeat / graph replay, PDL ---------------------

// One random ragged batch on the GPU with its fp32 CPU reference (same construction as
// MatchesCpuReference: shuffled pool with spare NaN blocks, NaN past each sequence's end).
struct RaggedProblem {
  Case tc;
  int64_t num_kv_heads, num_heads, hd, bs, num_seqs, max_blocks = 0;
  std::vector<int32_t> num_keys;
  std::vector<int64_t> newest_rows;  // element offsets of each (sequence, KV head)'s newest key
  std::vector<float> ref;
  float max_ref = 0.f;
  size_t q_elems = 0;
  std::unique_ptr<DevBuf> dq, dout, dk, dv, dtables, dctx, dcu;
  cuda::AttentionParams p;

  RaggedProblem(const Case& c, std::vector<int32_t> keys, int64_t kv_heads, uint32_t seed)
      : tc(c),
        num_kv_heads(kv_heads),
        num_heads(kv_heads * c.group),
        hd(c.head_dim),
        bs(c.block_size),
        num_seqs(int64_t(keys.size())),
        num_keys(std::move(keys)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    int64_t used_blocks = 0;
    for (int32_t n : num_keys) {
      max_blocks = std::max<int64_t>(max_blocks, (n + bs - 1) / bs);
      used_blocks += (n + bs - 1) / bs;
    }
    const int64_t num_blocks = used_blocks + 5;
    std::vector<int32_t> perm(num_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> tables(num_seqs * max_blocks, -1), context_lens(num_seqs),
        cu_q(num_seqs + 1);
    const PagedKvLayout layout{num_blocks, bs, num_kv_heads, hd};
    std::vector<float> k32(layout.pool_elements(), 0.f), v32(layout.pool_elements(), 0.f);
    std::vector<uint16_t> k16(k32.size(), NanBits(tc.dtype)), v16(v32.size(), NanBits(tc.dtype));
    int64_t next = 0;
    for (int64_t s = 0; s < num_seqs; ++s) {
      context_lens[s] = num_keys[s] - 1;
      cu_q[s] = static_cast<int32_t>(s);
      for (int64_t b = 0; b < (num_keys[s] + bs - 1) / bs; ++b)
        tables[s * max_blocks + b] = perm[next++];
      for (int64_t h = 0; h < num_kv_heads; ++h) {
        const int64_t pos = num_keys[s] - 1;
        newest_rows.push_back(layout.Offset(tables[s * max_blocks + pos / bs], h, pos % bs));
      }
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
    q_elems = size_t(num_seqs * num_heads * hd);
    std::vector<uint16_t> q16(q_elems);
    std::vector<float> q32(q_elems);
    for (size_t i = 0; i < q_elems; ++i) {
      q16[i] = ToBits(2.f * normal(rng), tc.dtype);
      q32[i] = FromBits(q16[i], tc.dtype);
    }
    const float scale = 1.f / std::sqrt(static_cast<float>(hd));
    AttentionBatch cpu_batch{num_seqs, cu_q.data(), context_lens.data(), tables.data(), max_blocks};
    ref.resize(q_elems);
    cpu::PagedDecodeAttention(q32.data(), PagedKvView<const float>{k32.data(), v32.data(), layout},
                              cpu_batch, num_heads, scale, ref.data(), 1);
    for (float r : ref) max_ref = std::max(max_ref, std::fabs(r));

    dq = std::make_unique<DevBuf>(q_elems * 2);
    dout = std::make_unique<DevBuf>(q_elems * 2);
    dk = std::make_unique<DevBuf>(k16.size() * 2);
    dv = std::make_unique<DevBuf>(v16.size() * 2);
    dtables = std::make_unique<DevBuf>(tables.size() * 4);
    dctx = std::make_unique<DevBuf>(context_lens.size() * 4);
    dcu = std::make_unique<DevBuf>(cu_q.size() * 4);
    DevBuf::Upload(*dq, q16);
    DevBuf::Upload(*dk, k16);
    DevBuf::Upload(*dv, v16);
    DevBuf::Upload(*dtables, tables);
    DevBuf::Upload(*dctx, context_lens);
    DevBuf::Upload(*dcu, cu_q);

    p.q = dq->p;
    p.out = dout->p;
    p.kv = PagedKvView<const void>{dk->p, dv->p, layout};
    p.batch = AttentionBatch{num_seqs, static_cast<const int32_t*>(dcu->p),
                             static_cast<const int32_t*>(dctx->p),
                             static_cast<const int32_t*>(dtables->p), max_blocks};
    p.num_heads = num_heads;
    p.scale = scale;
    p.dtype = tc.dtype;
    p.max_q_len = 1;
    p.max_num_keys = *std::max_element(num_keys.begin(), num_keys.end());
  }

  int64_t MaxTiles() const { return (p.max_num_keys + 63) / 64; }
  float Tol() const { return (tc.dtype == DType::kBF16 ? 2e-2f : 4e-3f) * max_ref; }
  size_t OutBytes() const { return q_elems * 2; }

  // NaN into an output-shaped device buffer (0xffff is a NaN in bf16 and fp16).
  void Poison(void* dptr, cudaStream_t stream = nullptr) const {
    LLM_CUDA_CHECK(cudaMemsetAsync(dptr, 0xff, OutBytes(), stream));
  }
  std::vector<uint16_t> Download(const void* dptr) const {
    std::vector<uint16_t> h(q_elems);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    LLM_CUDA_CHECK(cudaMemcpy(h.data(), dptr, OutBytes(), cudaMemcpyDeviceToHost));
    return h;
  }
  // Captures enqueue() on `stream` into a graph, then `replays` times: poisons the output,
  // replays, waits, and calls check(replay).
  template <typename Enqueue, typename Check>
  void ReplayCaptured(cudaStream_t stream, Enqueue&& enqueue, int replays, Check&& check) const {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    enqueue();
    LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < replays; ++replay) {
      Poison(p.out, stream);
      LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
      LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
      check(replay);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  // Max abs error against the CPU reference; any NaN fails the test.
  float MaxErr(const std::vector<uint16_t>& got, const std::string& what) const {
    float max_err = 0.f;
    for (size_t i = 0; i < got.size(); ++i) {
      const float g = FromBits(got[i], tc.dtype);
      EXPECT_FALSE(std::isnan(g)) << what << ": NaN at element " << i << " (seq "
                                  << int64_t(i) / (num_heads * hd) << ")";
      if (std::isnan(g)) return INFINITY;
      max_err = std::max(max_err, std::fabs(g - ref[i]));
    }
    return max_err;
  }
};

// A split workspace as the contract asks: zeroed once (the counters); here the partial area
// after the counters is then poisoned with NaN, so a merge that reads a partial the current
// call did not write produces NaN.
struct SplitWorkspace {
  size_t bytes;
  DevBuf buf;
  explicit SplitWorkspace(size_t b) : bytes(b), buf(b) {
    LLM_CUDA_CHECK(cudaMemset(buf.p, 0, bytes));
    if (bytes > cuda::kDecodeCounterBytes) {
      LLM_CUDA_CHECK(cudaMemset(static_cast<char*>(buf.p) + cuda::kDecodeCounterBytes, 0xff,
                                bytes - cuda::kDecodeCounterBytes));
    }
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Number of non-zero arrival counters (every call must leave them all zero).
  int64_t NonZeroCounters() const {
    std::vector<uint32_t> c(cuda::kDecodeMaxCounters);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    LLM_CUDA_CHECK(cudaMemcpy(c.data(), buf.p, cuda::kDecodeCounterBytes, cudaMemcpyDeviceToHost));
    return std::count_if(c.begin(), c.end(), [](uint32_t x) { return x != 0; });
  }
};

// Restores the process-wide PDL switch (tests flip it).
struct PdlGuard {
  bool saved = cuda::ProgrammaticLaunch();
  ~PdlGuard() { cuda::SetProgrammaticLaunch(saved); }
};

// RAII stream (graph capture and PDL need a non-default stream).
struct Stream {
  cudaStream_t s = nullptr;
  Stream() { LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

bool BitEqual(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 2) == 0;
}

class DecodeAttentionGpuV3 : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!GpuAvailable(&why)) GTEST_SKIP() << "no GPU, decode attention GPU test skipped: " << why;
  }
};

// Restores the process-wide SetDecodeKvBeforeWait (tests flip it).
struct KvBeforeWaitGuard {
  bool saved = cuda::DecodeKvBeforeWait();
  ~KvBeforeWaitGuard() { cuda::SetDecodeKvBeforeWait(saved); }
};

// The kernel right before the decode attention (the q|k|v projection's KV append) may still be
// writing each sequence's newest K/V row while the attention's prologue, which runs before its
// PdlWait, copies the first tiles (launch.h's named exception). Here that kernel is LateCopy:
// the newest rows hold NaN until it restores them, 200 µs after it let the attention launch, so
// a prologue that copied a newest row before its wait would attend over NaN. PDL on, the
// prologue before the wait and after it, eager and in a graph replayed three times (each replay
// re-poisons): within tolerance of the CPU, and the same bits every way. Shapes: newest keys in
// a prologue tile (one-tile splits, short sequences) and past it (one split over 5,000 keys);
// head_dim 64, 128 and 256 (the transposed 16-bit step).
TEST_F(DecodeAttentionGpuV3, NewestKeyWrittenLateByThePreviousKernel) {
  int major = 0;
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (major < 9)
    GTEST_SKIP() << "programmatic dependent launch needs sm_90 (compute " << major << ")";
  PdlGuard pdl_guard;
  KvBeforeWaitGuard kv_guard;
  cuda::SetProgrammaticLaunch(true);
  const Case cases[] = {
      {DType::kBF16, 128, 1, 16}, {DType::kF16, 64, 4, 32}, {DType::kBF16, 256, 2, 16}};
  for (const Case& tc : cases) {
    RaggedProblem pr(tc, {1, 37, 64 * 3 + 1, 5000, 64, 129}, 2, 99);
    const std::string shape = "hd " + std::to_string(tc.head_dim);
    // Device copies of the newest rows (K then V), NaN for the pools, and the pointer arrays.
    const int rows = int(pr.newest_rows.size());
    const int64_t row_bytes = pr.hd * 2;
    DevBuf saved{size_t(2 * rows * row_bytes)}, nan_row{size_t(row_bytes)};
    LLM_CUDA_CHECK(cudaMemset(nan_row.p, 0xff, size_t(row_bytes)));
    std::vector<void*> dst, src, poison_src;
    for (int i = 0; i < 2 * rows; ++i) {
      void* pool = i < rows ? pr.dk->p : pr.dv->p;
      dst.push_back(static_cast<char*>(pool) + pr.newest_rows[size_t(i % rows)] * 2);
      src.push_back(static_cast<char*>(saved.p) + i * row_bytes);
      LLM_CUDA_CHECK(
          cudaMemcpy(src.back(), dst.back(), size_t(row_bytes), cudaMemcpyDeviceToDevice));
      poison_src.push_back(nan_row.p);
    }
    DevBuf ddst{dst.size() * sizeof(void*)}, dsrc{src.size() * sizeof(void*)},
        dpoison{poison_src.size() * sizeof(void*)};
    DevBuf::Upload(ddst, dst);
    DevBuf::Upload(dsrc, src);
    DevBuf::Upload(dpoison, poison_src);
    SplitWorkspace ws(cuda::DecodeWorkspaceBytes(pr.num_seqs, pr.num_heads, pr.hd, 64));
    Stream stream;
    // The poison is written by a LateCopy with no delay (it completes before the restoring one
    // passes its wait), the true rows by one 200 µs after it let the attention launch.
    auto step = [&] {
      cuda::LateCopy(static_cast<void* const*>(ddst.p), static_cast<const void* const*>(dpoison.p),
                     2 * rows, row_bytes, 0, stream.s);
      cuda::LateCopy(static_cast<void* const*>(ddst.p), static_cast<const void* const*>(dsrc.p),
                     2 * rows, row_bytes, 200000, stream.s);
    };
    for (int splits : {0, 1, 64}) {
      std::vector<uint16_t> first;
      for (bool before : {true, false}) {
        cuda::SetDecodeKvBeforeWait(before);
        const std::string what = shape + ", splits " + std::to_string(splits) +
                                 (before ? ", prologue before the wait" : ", after the wait");
        pr.Poison(pr.p.out, stream.s);
        step();
        cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s);
        const std::vector<uint16_t> got = pr.Download(pr.p.out);
        EXPECT_LE(pr.MaxErr(got, what), pr.Tol()) << what;
        if (first.empty()) first = got;
        EXPECT_TRUE(BitEqual(got, first)) << what << ": differs from the first run";

        pr.ReplayCaptured(
            stream.s,
            [&] {
              step();
              cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s);
            },
            3,
            [&](int replay) {
              EXPECT_TRUE(BitEqual(pr.Download(pr.p.out), first))
                  << what << ": graph replay " << replay;
            });
        EXPECT_EQ(ws.NonZeroCounters(), 0) << what;
      }
    }
  }
}

// Many splits merged in the kernel: the split counts used are the ones requested (up to the
// tiles of the longest sequence), including 64 and 128, counts that do not divide the tiles
// (uneven splits: chunk sizes differ by one tile), and sequences with fewer tiles than splits
// (empty splits, which write no partial: the NaN-poisoned workspace catches a merge that reads
// one). Counters are zero after every call.
TEST_F(DecodeAttentionGpuV3, ManySplitsMergedInKernel) {
  struct C {
    Case tc;
    int64_t kv_heads;
  };
  for (const C& c : {C{Case{DType::kBF16, 128, 4, 16}, 2}, C{Case{DType::kF16, 64, 8, 8}, 1},
                     C{Case{DType::kBF16, 128, 16, 32}, 1}, C{Case{DType::kBF16, 256, 2, 16}, 2}}) {
    // 8193 keys = 129 tiles (128 splits: one split of 2 tiles, the rest 1); 4097 = 65 tiles
    // (64 splits: uneven); 150 keys = 3 tiles (most splits empty); 1 key; 64·40 = 40 tiles.
    RaggedProblem pr(c.tc, {4097, 1, 8193, 150, 64 * 40}, c.kv_heads,
                     77 + c.tc.head_dim + c.tc.group);
    SplitWorkspace ws(cuda::DecodeWorkspaceBytes(pr.num_seqs, pr.num_heads, pr.hd, 128));
    for (int splits : {2, 3, 7, 33, 64, 100, 128}) {
      pr.Poison(pr.p.out);
      cuda::DecodeLaunchInfo info;
      cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, nullptr, &info);
      const std::string what = std::string(DTypeName(c.tc.dtype)) + " hd " +
                               std::to_string(c.tc.head_dim) + " g " + std::to_string(c.tc.group) +
                               " splits " + std::to_string(splits);
      EXPECT_EQ(info.num_splits, std::min<int64_t>(splits, pr.MaxTiles())) << what;
      EXPECT_EQ(info.num_ctas, pr.num_seqs * pr.num_kv_heads * info.num_splits) << what;
      const float err = pr.MaxErr(pr.Download(pr.p.out), what);
      EXPECT_LE(err, pr.Tol()) << what << ", max|ref| " << pr.max_ref;
      EXPECT_EQ(ws.NonZeroCounters(), 0) << what;
    }
  }
}

// The same launch twice in a row, then captured into a CUDA graph and replayed 3 times (with
// PDL off and on during capture): the counters reset in-kernel, so every run merges correctly
// and the outputs are bit-identical to the first call (the output is NaN-poisoned before
// each run).
TEST_F(DecodeAttentionGpuV3, RepeatedCallsAndGraphReplaysBitIdentical) {
  PdlGuard guard;
  RaggedProblem pr(Case{DType::kBF16, 128, 4, 16}, {5000, 33, 64 * 64 + 7, 700}, 2, 4242);
  SplitWorkspace ws(cuda::DecodeWorkspaceBytes(pr.num_seqs, pr.num_heads, pr.hd, 64));
  Stream stream;
  for (int splits : {64, 0, 1}) {
    for (bool pdl : {false, true}) {
      cuda::SetProgrammaticLaunch(pdl);
      const std::string what = "splits " + std::to_string(splits) + (pdl ? " pdl" : " no-pdl");
      cuda::DecodeLaunchInfo info;
      pr.Poison(pr.p.out, stream.s);
      cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s, &info);
      const std::vector<uint16_t> first = pr.Download(pr.p.out);
      EXPECT_LE(pr.MaxErr(first, what), pr.Tol()) << what;
      if (splits == 64) {
        EXPECT_EQ(info.num_splits, 64) << what;
      }
      // Twice in a row without a host sync in between (the second call sees the counters the
      // first one reset), then once more after a poison.
      cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s);
      cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s);
      EXPECT_TRUE(BitEqual(pr.Download(pr.p.out), first)) << what << ": back-to-back calls";
      pr.Poison(pr.p.out, stream.s);
      cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s);
      EXPECT_TRUE(BitEqual(pr.Download(pr.p.out), first)) << what << ": third call";
      EXPECT_EQ(ws.NonZeroCounters(), 0) << what;

      // Graph: two launches (the second depends on the first through the stream, with a
      // programmatic edge when PDL is on), replayed 3 times.
      pr.ReplayCaptured(
          stream.s,
          [&] {
            cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s);
            cuda::PagedDecodeAttention(pr.p, splits, ws.buf.p, ws.bytes, stream.s);
          },
          3,
          [&](int replay) {
            EXPECT_TRUE(BitEqual(pr.Download(pr.p.out), first)) << what << ": replay " << replay;
            EXPECT_EQ(ws.NonZeroCounters(), 0) << what << ": replay " << replay;
          });
    }
  }
}

// PDL on vs off: a chain of three dependent launches sharing one workspace, each reading the
// previous one's output as its q (out1 = A(q), out2 = A(out1), out3 = A(out2)), so a PdlWait
// placed after a read of q, or a counter reset not visible to the next launch, changes the
// result. All three outputs must be bit-identical with the programmatic attribute on and off,
// for the split (in-kernel merge), automatic and unsplit paths.
TEST_F(DecodeAttentionGpuV3, PdlOnOffBitIdentical) {
  PdlGuard guard;
  RaggedProblem pr(Case{DType::kBF16, 128, 4, 16}, {4999, 1, 2048 + 3, 130}, 2, 99);
  SplitWorkspace ws(cuda::DecodeWorkspaceBytes(pr.num_seqs, pr.num_heads, pr.hd, 64));
  DevBuf out1(pr.OutBytes()), out2(pr.OutBytes()), out3(pr.OutBytes());
  Stream stream;
  for (int splits : {64, 0, 1}) {
    std::vector<uint16_t> results[2][3];
    for (int pdl = 0; pdl < 2; ++pdl) {
      cuda::SetProgrammaticLaunch(pdl == 1);
      DevBuf* outs[3] = {&out1, &out2, &out3};
      for (DevBuf* o : outs) pr.Poison(o->p, stream.s);
      cuda::AttentionParams p = pr.p;
      for (int i = 0; i < 3; ++i) {
        p.q = i == 0 ? pr.p.q : outs[i - 1]->p;
        p.out = outs[i]->p;
        cuda::PagedDecodeAttention(p, splits, ws.buf.p, ws.bytes, stream.s);
      }
      LLM_CUDA_CHECK(cudaStreamSynchronize(stream.s));
      for (int i = 0; i < 3; ++i) results[pdl][i] = pr.Download(outs[i]->p);
      EXPECT_EQ(ws.NonZeroCounters(), 0) << "splits " << splits << " pdl " << pdl;
    }
    const std::string what = "splits " + std::to_string(splits);
    EXPECT_LE(pr.MaxErr(results[0][0], what), pr.Tol()) << what;
    for (int i = 0; i < 3; ++i) {
      for (uint16_t h : results[0][i]) {
        ASSERT_FALSE(std::isnan(FromBits(h, DType::kBF16))) << what << " output " << i;
      }
      EXPECT_TRUE(BitEqual(results[0][i], results[1][i]))
          << what << ": output " << i << " differs with PDL on";
    }
  }
}

// The workspace contract: a split request the workspace cannot hold runs with what it holds
// (down to no split without a workspace), never reading past it; a workspace sized for n
// splits runs n.
TEST_F(DecodeAttentionGpuV3, SplitsCappedByWorkspace) {
  RaggedProblem pr(Case{DType::kBF16, 128, 4, 16}, {3000, 64}, 2, 7);
  SplitWorkspace ws(cuda::DecodeWorkspaceBytes(pr.num_seqs, pr.num_heads, pr.hd, 5));
  struct R {
    void* ws;
    size_t bytes;
    int want;
    int expect;
  };
  for (const R& r :
       {R{ws.buf.p, ws.bytes, 5, 5}, R{ws.buf.p, ws.bytes, 40, 5}, R{ws.buf.p, ws.bytes - 1, 5, 4},
        R{nullptr, 0, 8, 1}, R{ws.buf.p, cuda::kDecodeCounterBytes, 8, 1}}) {
    pr.Poison(pr.p.out);
    cuda::DecodeLaunchInfo info;
    cuda::PagedDecodeAttention(pr.p, r.want, r.ws, r.bytes, nullptr, &info);
    const std::string what = "want " + std::to_string(r.want) + " bytes " + std::to_string(r.bytes);
    EXPECT_EQ(info.num_splits, r.expect) << what;
    EXPECT_LE(pr.MaxErr(pr.Download(pr.p.out), what), pr.Tol()) << what;
  }
  EXPECT_EQ(ws.NonZeroCounters(), 0);
}

// The automatic selector on the bench shapes (GQA 32/8, hd 128; on a 132-SM H200 with 2
// CTAs/SM, 264 slots): few-CTA shapes fill the resident slots in one wave (1×32k: 33 splits,
// 264 CTAs; 1×4k: 32 splits of 2 tiles), large batches do not split.
TEST_F(DecodeAttentionGpuV3, AutoSplitsFillTheMachine) {
  int device = 0, sms = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  RaggedProblem pr(Case{DType::kBF16, 128, 4, 16}, {100}, 8, 1);
  cuda::DecodeLaunchInfo info;
  cuda::PagedDecodeAttention(pr.p, 1, nullptr, 0, nullptr, &info);
  const int slots = sms * info.ctas_per_sm;
  const int s32k = cuda::DecodeAutoSplits(1, 8, 32768, 128, 128);
  const int s4k = cuda::DecodeAutoSplits(1, 8, 4096, 128, 128);
  const int s16x4k = cuda::DecodeAutoSplits(16, 8, 4096, 128, 128);
  std::printf("[ info ] %d SMs x %d CTAs: auto splits 1x32k %d, 1x4k %d, 16x4k %d\n", sms,
              info.ctas_per_sm, s32k, s4k, s16x4k);
  EXPECT_EQ(s32k, std::min(128, slots / 8));         // every slot of one wave
  EXPECT_EQ(s4k, std::min(32, slots / 8));           // 64 tiles, >= 2 per split
  EXPECT_LE(16 * 8 * s16x4k, std::max(slots, 128));  // one wave
  EXPECT_EQ(cuda::DecodeAutoSplits(64, 8, 4096, 128, 128), 1);
  EXPECT_EQ(cuda::DecodeAutoSplits(64, 8, 16384, 128, 128), 1);
  EXPECT_EQ(cuda::DecodeAutoSplits(256, 8, 2048, 128, 128), 1);
  EXPECT_EQ(cuda::DecodeAutoSplits(1, 8, 100, 128, 128), 1);  // 2 tiles: no split
  EXPECT_EQ(cuda::DecodeAutoSplits(1, 8, 32768, 128, 7), 7);  // the workspace's cap
  // One tile per split allowed (the executor's short contexts at small batch): 2 tiles split
  // in 2; Llama-2-7B at batch 1 (32 KV heads), 256 keys: 4 tiles, 4 splits of one tile.
  EXPECT_EQ(cuda::DecodeAutoSplits(1, 8, 100, 128, 128, 1), 2);
  if (slots >= 128) {
    EXPECT_EQ(cuda::DecodeAutoSplits(1, 32, 256, 128, 128, 1), 4);
  }
  EXPECT_EQ(cuda::DecodeAutoSplits(1, 32, 256, 128, 128), 2);
}

// head_dim 256 (one CTA per SM: 3 stages of 64 KiB): the selector counts its own occupancy,
// so a single 32k sequence with 8 KV heads fills the SMs in one wave.
TEST_F(DecodeAttentionGpuV3, AutoSplitsKnowHeadDim256) {
  int device = 0, sms = 0;
  LLM_CUDA_CHECK(cudaGetDevice(&device));
  LLM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  RaggedProblem pr(Case{DType::kBF16, 256, 2, 16}, {100}, 8, 1);
  cuda::DecodeLaunchInfo info;
  cuda::PagedDecodeAttention(pr.p, 1, nullptr, 0, nullptr, &info);
  EXPECT_GE(info.ctas_per_sm, 1);
  const int slots = sms * info.ctas_per_sm;
  const int s32k = cuda::DecodeAutoSplits(1, 8, 32768, 256, 128);
  std::printf("[ info ] hd 256: %d SMs x %d CTAs: auto splits 1x32k %d\n", sms, info.ctas_per_sm,
              s32k);
  EXPECT_EQ(s32k, std::min(128, slots / 8));
  EXPECT_EQ(cuda::DecodeAutoSplits(64, 8, 8192, 256, 128), 1);  // 512 CTAs: no split
  EXPECT_EQ(cuda::DecodeAutoSplits(1, 8, 100, 256, 128), 1);    // 2 tiles: no split
}

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
  p.kv.layout.head_dim = 512;
  EXPECT_THROW(cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr), std::invalid_argument);
  p.kv.layout.head_dim = 256;  // the warp-item kernels (fp8 only) take 64 and 128
  p.kv_format.fp8 = true;
  try {
    cuda::PagedDecodeAttention(p, 1, nullptr, 0, nullptr, nullptr,
                               cuda::DecodeKernelChoice::kWarpItemsT);
    FAIL() << "warp items at head_dim 256 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
  p.kv_format.fp8 = false;
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
    DevBuf dk(kb.size()), dv(vb.size()), dkc(kcb.size()), dvc(vcb.size()), dslots(slots.size() * 8);
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
