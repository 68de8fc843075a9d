// The small-batch GEMV (kernels/cuda/gemv/gemv.h) against a float64 CPU reference of the same
// math: y = x · wᵀ of half-precision inputs, with half-precision weights or fp8 (e4m3) codes
// and row scales from cpu::QuantizeFp8Rows (dequantized as the CPU twin cpu::Linear reads them),
// then each epilogue (store rounded to the dtype, fp32 store, fp32 accumulate, SiLU·mul of the
// gate and up halves rounded as the unfused kernels round), on the register kernel and on the
// ring kernel (GemvArgs::ring); every e4m3 code converted exactly; a chain of RMSNorms and GEMVs
// under programmatic dependent launch in a CUDA graph, on both kernels, bit-identical to plain
// launches; and the argument checks (GemvSupports). The fused SiLU·mul and RoPE epilogues and
// the folded RMSNorm: gemv_fused_gpu_test.cc; fixtures in gemv_fixtures.h. Label gpu (skips
// without a GPU, except GemvApi).
//   ninja -C build gemv_gpu_test && (cd build && ctest -L gpu -R gemv_gpu_test)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/gemv/gemv.h"
#include "kernels/cuda/ops/model_ops.h"
#include "kernels/dtype.h"
#include "kernels/fp8.h"
#include "tests/kernels/gemv_fixtures.h"

namespace llm::test::gemv {
namespace {

struct Case {
  DType dtype;
  E epilogue;
  int n, m, k;
  bool norm = false;  // the RMSNorm prologue over an fp32 residual
  bool fp8 = false;   // e4m3 weights with one scale per row (w_scale)
};

std::string Name(const Case& c) {
  const char* e = c.epilogue == E::kStore           ? "store"
                  : c.epilogue == E::kStoreF32      ? "storef32"
                  : c.epilogue == E::kAccumulateF32 ? "accf32"
                                                    : "silumul";
  return std::string(c.dtype == DType::kBF16 ? "bf16" : "fp16") + "_" + e + "_n" +
         std::to_string(c.n) + "_m" + std::to_string(c.m) + "_k" + std::to_string(c.k) +
         (c.norm ? "_rmsnorm" : "") + (c.fp8 ? "_fp8" : "");
}

class GemvGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  }
};

TEST_P(GemvGpu, MatchesFloat64Reference) {
  const Case c = GetParam();
  std::mt19937 rng(c.n * 131 + c.m + c.k);
  const int64_t n = c.n, m = c.m, k = c.k;
  const bool silu = c.epilogue == E::kSiluMul;
  const bool f32_out = c.epilogue == E::kStoreF32 || c.epilogue == E::kAccumulateF32;
  const int64_t outs = silu ? m / 2 : m;
  const std::vector<uint16_t> x = RandomHalf(c.dtype, size_t(n * k), 1.f, rng);
  // dtype weights, or e4m3 codes with row scales.
  const std::vector<uint16_t> w =
      c.fp8 ? std::vector<uint16_t>() : RandomHalf(c.dtype, size_t(m * k), 0.05f, rng);
  const Fp8Matrix w8 = c.fp8 ? RandomFp8(m, k, 0.05f, rng) : Fp8Matrix{};
  std::normal_distribution<float> dist(0.f, 1.f);
  // The activations the kernel multiplies: x, or the prologue's dtype(g * (x * inv_rms)) of an
  // fp32 residual, computed in float as cuda::AddRmsNorm computes it.
  std::vector<float> resid(static_cast<size_t>(n * k)), gain(static_cast<size_t>(k)),
      act(static_cast<size_t>(n * k));
  const float eps = 1e-5f;
  for (float& v : resid) v = 3.f * dist(rng);
  for (float& v : gain) v = 1.f + 0.3f * dist(rng);
  for (int64_t t = 0; t < n; ++t) {
    double ss = 0;
    for (int64_t i = 0; i < k; ++i) ss += double(resid[t * k + i]) * resid[t * k + i];
    const float inv = 1.f / std::sqrt(float(ss) / float(k) + eps);
    for (int64_t i = 0; i < k; ++i) {
      act[t * k + i] = c.norm ? RoundHalf(c.dtype, gain[i] * (resid[t * k + i] * inv))
                              : FromHalf(c.dtype, x[t * k + i]);
    }
  }
  std::vector<float> y0(size_t(n * outs));
  for (float& v : y0) v = dist(rng);
  // s[t][j] and sum |a w| (the scale of fp32 accumulation-order error), over the weights as
  // the CPU twin reads them (cpu::LoadRow: dtype, or scale · E4m3ToF32(code) in fp32).
  cpu::WeightMatrix wm;
  wm.dtype = c.fp8 ? DType::kF8E4M3 : c.dtype;
  wm.data = c.fp8 ? static_cast<const void*>(w8.codes.data()) : w.data();
  wm.rows = m;
  wm.cols = k;
  wm.scales = c.fp8 ? w8.scales.data() : nullptr;
  std::vector<double> sum(size_t(n * m)), mag(size_t(n * m));
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = 0; j < m; ++j) {
    cpu::LoadRow(wm, j, row.data());
    for (int64_t t = 0; t < n; ++t) {
      double acc = 0, a = 0;
      for (int64_t i = 0; i < k; ++i) {
        const double p = double(act[t * k + i]) * row[i];
        acc += p;
        a += std::fabs(p);
      }
      sum[t * m + j] = acc;
      mag[t * m + j] = a;
    }
  }
  void* dx = c.norm ? static_cast<void*>(Upload(resid)) : static_cast<void*>(Upload(x));
  float* dgain = Upload(gain);
  void* dw = c.fp8 ? static_cast<void*>(Upload(w8.codes)) : static_cast<void*>(Upload(w));
  float* dscale = c.fp8 ? Upload(w8.scales) : nullptr;
  void* dy = f32_out ? static_cast<void*>(Upload(y0))
                     : static_cast<void*>(Upload(std::vector<uint16_t>(size_t(n * outs), 0x7fc0)));
  cuda::GemvArgs a = Args(c.epilogue, dx, dw, dscale, dy, n, m, k, c.dtype);
  a.norm_weight = c.norm ? dgain : nullptr;
  a.eps = eps;
  ASSERT_TRUE(cuda::GemvSupports(a));
  cuda::Gemv(a, nullptr);
  LLM_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(size_t(n * outs));
  if (f32_out) {
    got = Download<float>(dy, got.size());
  } else {
    const std::vector<uint16_t> h = Download<uint16_t>(dy, got.size());
    for (size_t i = 0; i < h.size(); ++i) got[i] = FromHalf(c.dtype, h[i]);
  }
  const double ulp = c.dtype == DType::kBF16 ? 1.0 / 128 : 1.0 / 1024;
  // fp32 accumulation in another order, relative to sum |a w|; with the prologue an activation
  // can round to the neighbouring half value (its inv_rms summed in another order). With fp8
  // weights the same bound (the kernel scales the fp32 sum once; the CPU twin rounds each
  // scale · code to fp32: 2^-24 relative). A lost scale is off by 1 / scale (~2000 here), a
  // wrong code or a misplaced activation chunk by O(|s|) over thousands of products.
  const double rel = c.norm ? 2e-4 : 1e-5;
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < outs; ++j) {
      const double s = sum[t * m + j], sm = mag[t * m + j];
      double ref = 0, tol = 0;
      switch (c.epilogue) {
        case E::kStore:
          ref = s;
          tol = rel * sm + ulp * std::fabs(s);
          break;
        case E::kStoreF32:
          ref = s;
          tol = rel * sm;
          break;
        case E::kAccumulateF32:
          ref = y0[t * outs + j] + s;
          tol = rel * sm + 1e-6 * std::fabs(y0[t * outs + j]);
          break;
        case E::kSiluMul: {
          const double su = sum[t * m + outs + j], smu = mag[t * m + outs + j];
          const double g = RoundHalf(c.dtype, s), u = RoundHalf(c.dtype, su);
          const double silu_g = g / (1 + std::exp(-g));
          ref = silu_g * u;
          // g and u may round to a neighbouring half value (|silu'| <= 1.1).
          const double dg = rel * sm + ulp * std::fabs(g), du = rel * smu + ulp * std::fabs(u);
          tol = 1.1 * std::fabs(u) * dg + std::fabs(silu_g) * du + dg * du + ulp * std::fabs(ref);
          break;
        }
        case E::kRopeAppendKv:
          FAIL() << "covered by GemvRopeGpu";
      }
      tol += 1e-6;
      const double v = got[t * outs + j];
      ASSERT_TRUE(std::isfinite(v)) << "token " << t << " output " << j;
      worst = std::max(worst, std::fabs(v - ref) / tol);
      ASSERT_LE(std::fabs(v - ref), tol) << "token " << t << " output " << j << " ref " << ref;
    }
  }
  std::printf("  %s: worst error %.2f of tolerance\n", Name(c).c_str(), worst);
  // The same call on at most 1, 2 or 3 CTAs (GemvArgs::max_ctas): each CTA walks many row
  // groups (the persistent loop, its double buffers across group boundaries, the group-parity
  // scratch) and must give the same bits as one wave (the reduction order does not change);
  // then with one CTA per group (GemvArgs::waves = 0, the executor's o projection); then the
  // ring kernel (GemvArgs::ring: weights through shared memory; not with the prologue) on one
  // wave and on 1 and 3 CTAs (the last with a 2-slot ring), whose slots are reused many times;
  // last the balanced wave (GemvArgs::balanced: fewer CTAs, equal shares).
  for (int run = 0; run < 8; ++run) {
    const bool balanced = run == 7;
    const int ctas = balanced       ? 0
                     : run < 4      ? (run + 1) % 4
                     : run - 4 == 0 ? 0
                     : run - 4 == 1 ? 1
                                    : 3;
    const bool ring = run >= 4 && !balanced;
    if (ring && c.norm) continue;
    if (f32_out) {
      LLM_CUDA_CHECK(cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
    } else {
      LLM_CUDA_CHECK(cudaMemset(dy, 0xff, size_t(n * outs) * 2));
    }
    cuda::GemvArgs few = a;
    few.max_ctas = ctas;
    few.ring = ring;
    few.balanced = balanced;
    if (ring && ctas == 3) few.ring_kib = 1;  // the smallest ring: 2 slots, reused most
    if (ctas == 0 && !ring && !balanced) few.waves = 0;
    ASSERT_TRUE(cuda::GemvSupports(few));
    cuda::Gemv(few, nullptr);
    LLM_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> again(got.size());
    if (f32_out) {
      again = Download<float>(dy, got.size());
    } else {
      const std::vector<uint16_t> h = Download<uint16_t>(dy, got.size());
      for (size_t i = 0; i < h.size(); ++i) again[i] = FromHalf(c.dtype, h[i]);
    }
    size_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &again[i], 4) != 0;
    EXPECT_EQ(differ, 0u) << (ring       ? "ring kernel, "
                              : balanced ? "balanced, "
                                         : "")
                          << (ctas > 0 ? std::to_string(ctas) + " CTAs"
                              : ring   ? std::string("one wave")
                                       : std::string("one CTA per group"));
  }
  cudaFree(dx);
  cudaFree(dgain);
  cudaFree(dw);
  cudaFree(dscale);
  cudaFree(dy);
}

std::vector<Case> Cases() {
  std::vector<Case> out;
  for (DType d : {DType::kBF16, DType::kF16}) {
    for (E e : {E::kStore, E::kStoreF32, E::kAccumulateF32, E::kSiluMul}) {
      // Stages of 2048 columns (256 threads × one 16-byte chunk).
      out.push_back({d, e, 1, 1000, 512});   // k < one stage
      out.push_back({d, e, 3, 78, 2048});    // exactly one stage; m not a multiple of 4
      out.push_back({d, e, 3, 78, 4096});    // two stages; m not a multiple of 4
      out.push_back({d, e, 8, 256, 11008});  // 6 stages, the last partial (Llama-2 down)
      out.push_back({d, e, 2, 6, 14336});    // 7 stages (Llama-3 down); 2 groups
      // n = 2 with 13 groups: on 1-3 CTAs each walks >= 5 groups (parity scratch and, for e4m3
      // below, every scale slot reused), one stage per group and a partial second
      out.push_back({d, e, 2, 50, 2048});
      out.push_back({d, e, 2, 50, 2056});
    }
  }
  // The RMSNorm prologue (its normalized rows in shared memory: n · k · 2 <= 32 KiB), with
  // dtype and e4m3 weights.
  for (DType d : {DType::kBF16, DType::kF16}) {
    for (E e : {E::kStore, E::kSiluMul}) {
      for (bool fp8 : {false, true}) {
        out.push_back({d, e, 1, 1000, 4096, true, fp8});
        out.push_back({d, e, 2, 78, 8192, true, fp8});  // exactly 32 KiB of rows
        out.push_back({d, e, 4, 50, 4096, true, fp8});  // 13 groups, 32 KiB
        out.push_back({d, e, 3, 78, 4096, true, fp8});  // n < the kernel's N (4)
        out.push_back({d, e, 8, 64, 1008, true, fp8});
      }
    }
  }
  out.push_back({DType::kBF16, E::kAccumulateF32, 5, 4100, 8});
  out.push_back({DType::kBF16, E::kSiluMul, 7, 10, 40});
  out.push_back({DType::kF16, E::kStore, 4, 1, 8200});
  // e4m3 weights: 16 codes per 16-byte chunk, stages of 2048 columns (128 threads × 1 chunk).
  for (DType d : {DType::kBF16, DType::kF16}) {
    for (E e : {E::kStore, E::kStoreF32, E::kAccumulateF32, E::kSiluMul}) {
      out.push_back({d, e, 1, 1000, 2048, false, true});  // exactly one stage
      out.push_back({d, e, 1, 1000, 4096, false, true});  // two stages
      out.push_back({d, e, 2, 6, 4112, false, true});     // 3 stages, the 3rd one chunk; 2 groups
      out.push_back({d, e, 2, 50, 2048, false, true});    // 13 groups of one stage (see above)
      out.push_back({d, e, 3, 78, 11008, false, true});   // 6 stages, the last partial; m % 4 = 2
      out.push_back({d, e, 8, 254, 16400, false, true});  // 9 stages (both buffers reloaded)
    }
  }
  out.push_back({DType::kBF16, E::kAccumulateF32, 5, 4100, 16, false, true});  // one chunk
  out.push_back({DType::kF16, E::kStore, 4, 1, 8208, false, true});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemvGpu, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return Name(info.param); });

// Every e4m3 code, exactly: row j holds code (j + 16 i) % 256 in column i (the two NaN codes,
// which cpu::QuantizeFp8Rows never makes, replaced by 0) and token t is one-hot at column
// p[t], so y[t, j] = scale[j] · E4m3ToF32(code) with one fp32 rounding on the host and on the
// device alike. Checks the conversion (subnormals, ±0, ±448), the order of the codes within a
// 16-byte chunk and the pairing of each half of it with its own chunk of x, bit for bit.
TEST(GemvFp8, EveryCodeConvertsExactly) {
  std::string why;
  if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  const int64_t m = 256, k = 32, max_n = 8;
  // Every byte of a 32-bit word, both 8-code halves of both 16-byte chunks.
  const int64_t p[max_n] = {0, 3, 5, 6, 9, 12, 17, 30};
  std::vector<uint8_t> codes(static_cast<size_t>(m * k));
  std::vector<float> scales(static_cast<size_t>(m));
  for (int64_t j = 0; j < m; ++j) {
    scales[j] = 0.75f + 0.00123f * float(j);
    for (int64_t i = 0; i < k; ++i) {
      const uint8_t code = uint8_t((j + 16 * i) % 256);
      codes[j * k + i] = (code & 0x7f) == 0x7f ? 0 : code;
    }
  }
  uint8_t* dw = Upload(codes);
  float* dscale = Upload(scales);
  float* dy = Upload(std::vector<float>(static_cast<size_t>(max_n * m)));
  for (DType dt : {DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> x(static_cast<size_t>(max_n * k), ToHalf(dt, 0.f));
    for (int64_t t = 0; t < max_n; ++t) x[t * k + p[t]] = ToHalf(dt, 1.f);
    uint16_t* dx = Upload(x);
    for (int64_t n : {int64_t{1}, max_n}) {
      const cuda::GemvArgs a = Args(E::kStoreF32, dx, dw, dscale, dy, n, m, k, dt);
      ASSERT_TRUE(cuda::GemvSupports(a));
      cuda::Gemv(a, nullptr);
      LLM_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<float> got = Download<float>(dy, static_cast<size_t>(n * m));
      size_t differ = 0;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t j = 0; j < m; ++j) {
          const uint8_t code = codes[j * k + p[t]];
          const float want = scales[j] * E4m3ToF32(code);
          if (got[t * m + j] == want) continue;
          if (++differ <= 5) {
            ADD_FAILURE() << "n " << n << " token " << t << " code 0x" << std::hex << int(code)
                          << std::dec << ": got " << got[t * m + j] << ", want " << want;
          }
        }
      }
      EXPECT_EQ(differ, 0u) << (dt == DType::kBF16 ? "bf16" : "fp16") << " n " << n;
    }
    cudaFree(dx);
  }
  cudaFree(dw);
  cudaFree(dscale);
  cudaFree(dy);
}

// A decode-like chain (GEMV → GEMV reading its output → GEMV accumulating) captured in a CUDA
// graph under programmatic dependent launch, replayed several times: every replay equals the
// plain-launch result bit for bit (a missing PdlWait would let a GEMV read a stale input).
// Two decode-like layers (RMSNorm, gate|up with SiLU·mul, a store GEMV, a residual
// accumulate) with dtype or e4m3 weights, on the register kernel and on the ring kernel:
// launched plainly, then captured under programmatic dependent launch (the RMSNorm and the
// ring GEMV let dependents launch before their own wait, so up to three kernels overlap) and
// replayed; every replay bit-identical to the plain register-kernel run.
TEST(GemvChain, ProgrammaticLaunchInAGraphIsBitIdenticalToPlainLaunches) {
  std::string why;
  if (!cuda::DeviceAvailable(&why)) GTEST_SKIP() << "no GPU: " << why;
  const DType dt = DType::kBF16;
  const int64_t n = 1, k = 4096, m1 = 8192, m2 = 4096;
  std::mt19937 rng(7);
  uint16_t* dw1 = Upload(RandomHalf(dt, size_t(m1 * k), 0.05f, rng));
  uint16_t* dw2 = Upload(RandomHalf(dt, size_t(m2 * (m1 / 2)), 0.05f, rng));
  uint16_t* dw3 = Upload(RandomHalf(dt, size_t(k * m2), 0.05f, rng));
  const Fp8Matrix q1 = RandomFp8(m1, k, 0.05f, rng), q2 = RandomFp8(m2, m1 / 2, 0.05f, rng),
                  q3 = RandomFp8(k, m2, 0.05f, rng);
  uint8_t* dc1 = Upload(q1.codes);
  uint8_t* dc2 = Upload(q2.codes);
  uint8_t* dc3 = Upload(q3.codes);
  float* ds1 = Upload(q1.scales);
  float* ds2 = Upload(q2.scales);
  float* ds3 = Upload(q3.scales);
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> r0(static_cast<size_t>(n * k)), gain(static_cast<size_t>(k));
  for (float& v : r0) v = dist(rng);
  for (float& v : gain) v = 1.f + 0.2f * dist(rng);
  float* dgain = Upload(gain);
  uint16_t* dnormed = Upload(std::vector<uint16_t>(size_t(n * k)));
  uint16_t* dh = Upload(std::vector<uint16_t>(size_t(n * m1 / 2)));
  uint16_t* dg = Upload(std::vector<uint16_t>(size_t(n * m2)));
  float* dr = Upload(r0);
  float* dr0 = Upload(r0);  // the chain's starting residual (a device-to-device copy)
  cudaStream_t stream = nullptr;
  LLM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (bool fp8 : {false, true}) {
    auto chain = [&](bool ring) {
      LLM_CUDA_CHECK(cudaMemcpyAsync(dr, dr0, r0.size() * 4, cudaMemcpyDeviceToDevice, stream));
      for (int layer = 0; layer < 2; ++layer) {
        cuda::AddRmsNorm(dr, nullptr, dgain, dnormed, dt, nullptr, n, k, 1e-5f, stream);
        cuda::GemvArgs a;
        a.dtype = dt;
        a.n = n;
        a.ring = ring;
        a.epilogue = E::kSiluMul;  // h = silu(x W1g) * (x W1u)
        a.x = dnormed, a.y = dh, a.m = m1, a.k = k;
        a.w = fp8 ? static_cast<const void*>(dc1) : dw1, a.w_scale = fp8 ? ds1 : nullptr;
        cuda::Gemv(a, stream);
        a.epilogue = E::kStore;  // g = h W2
        a.x = dh, a.y = dg, a.m = m2, a.k = m1 / 2;
        a.w = fp8 ? static_cast<const void*>(dc2) : dw2, a.w_scale = fp8 ? ds2 : nullptr;
        cuda::Gemv(a, stream);
        a.epilogue = E::kAccumulateF32;  // r += g W3
        a.x = dg, a.y = dr, a.m = k, a.k = m2;
        a.w = fp8 ? static_cast<const void*>(dc3) : dw3, a.w_scale = fp8 ? ds3 : nullptr;
        cuda::Gemv(a, stream);
      }
    };
    cuda::SetProgrammaticLaunch(false);
    chain(false);
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<float> want = Download<float>(dr, size_t(n * k));
    double change = 0;
    for (size_t i = 0; i < want.size(); ++i) change += std::fabs(double(want[i]) - r0[i]);
    EXPECT_GT(change, 1.0) << "the chain moves the residual";
    for (bool ring : {false, true}) {
      cuda::SetProgrammaticLaunch(true);
      cudaGraph_t graph = nullptr;
      LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      chain(ring);
      LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
      cuda::SetProgrammaticLaunch(false);
      cudaGraphExec_t exec = nullptr;
      LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      for (int replay = 0; replay < 20; ++replay) {
        LLM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
        LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
        const std::vector<float> got = Download<float>(dr, size_t(n * k));
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
        ASSERT_EQ(differ, 0u) << "replay " << replay << (fp8 ? ", e4m3" : ", bf16")
                              << (ring ? ", ring kernel" : "");
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
  }
  cudaStreamDestroy(stream);
  for (void* p : {static_cast<void*>(dw1), static_cast<void*>(dw2), static_cast<void*>(dw3),
                  static_cast<void*>(dc1), static_cast<void*>(dc2), static_cast<void*>(dc3),
                  static_cast<void*>(ds1), static_cast<void*>(ds2), static_cast<void*>(ds3),
                  static_cast<void*>(dgain), static_cast<void*>(dnormed), static_cast<void*>(dh),
                  static_cast<void*>(dg), static_cast<void*>(dr), static_cast<void*>(dr0)})
    cudaFree(p);
}

TEST(GemvApi, RejectsWhatItCannotRun) {
  cuda::GemvArgs a;
  alignas(16) static uint16_t buf[64];
  a.x = buf;
  a.w = buf;
  a.y = buf;
  a.n = 9;
  a.m = 4;
  a.k = 8;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.n = 1;
  a.k = 12;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.k = 16;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.epilogue = E::kSiluMul;
  a.m = 3;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.m = 4;
  EXPECT_TRUE(cuda::GemvSupports(a));
  alignas(16) static float gain[16];
  a.norm_weight = gain;
  EXPECT_TRUE(cuda::GemvSupports(a));
  // The prologue's rows must fit its shared memory: n · k · 2 <= 32 KiB.
  a.n = 2, a.k = 8192;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.k = 8200;
  EXPECT_FALSE(cuda::GemvSupports(a));
  EXPECT_THROW(cuda::Gemv(a, nullptr), std::invalid_argument);
  a.n = 1, a.k = 16;
  a.epilogue = E::kAccumulateF32;  // no RMSNorm prologue on the residual projections
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.norm_weight = nullptr;
  a.epilogue = E::kRopeAppendKv;  // no positions / slots / cache
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.epilogue = E::kSiluMul;
  a.dtype = DType::kF32;
  EXPECT_FALSE(cuda::GemvSupports(a));
  EXPECT_THROW(cuda::Gemv(a, nullptr), std::invalid_argument);
  // fp8 weights: 16 codes per 16-byte chunk; the RMSNorm prologue as with dtype weights.
  alignas(16) static float scales[4];
  a.dtype = DType::kBF16;
  a.epilogue = E::kStore;
  a.w_scale = scales;
  a.k = 32;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.k = 24;  // k % 8 == 0 but not k % 16
  EXPECT_FALSE(cuda::GemvSupports(a));
  EXPECT_THROW(cuda::Gemv(a, nullptr), std::invalid_argument);
  a.k = 32;
  a.norm_weight = gain;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.epilogue = E::kSiluMul;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.epilogue = E::kStoreF32;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.epilogue = E::kSiluMul;
  a.norm_weight = nullptr;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.w = reinterpret_cast<const uint8_t*>(buf) + 8;  // w not 16-byte aligned
  EXPECT_FALSE(cuda::GemvSupports(a));
  // The folded RMSNorm: bf16 only; the producer (kAccumulateF32) needs its weight and its
  // dtype output, the consumer its partial count; never with the prologue or kStoreF32.
  alignas(16) static float partials[8];
  a.w_scale = nullptr;
  a.w = buf;
  a.rms_partials = partials;
  a.epilogue = E::kAccumulateF32;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.rms_weight = gain;
  a.rms_x = buf;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.dtype = DType::kF16;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.dtype = DType::kBF16;
  a.epilogue = E::kStore;
  EXPECT_FALSE(cuda::GemvSupports(a));  // no partial count
  a.rms_num_partials = 7;               // not the producer's ceil(k / 4) = 8 groups (k = 32)
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.rms_num_partials = 8;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.norm_weight = gain;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.norm_weight = nullptr;
  a.epilogue = E::kStoreF32;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.rms_partials = nullptr;
  EXPECT_TRUE(cuda::GemvSupports(a));
  // The ring kernel: neither the prologue nor the fold.
  a.ring = true;
  EXPECT_TRUE(cuda::GemvSupports(a));
  for (int kib : {0, cuda::kGemvMaxRingKib + 1}) {
    a.ring_kib = kib;
    EXPECT_FALSE(cuda::GemvSupports(a)) << "ring of " << kib << " KiB";
  }
  a.ring_kib = cuda::kGemvMaxRingKib;
  EXPECT_TRUE(cuda::GemvSupports(a));
  a.norm_weight = gain;
  a.epilogue = E::kStore;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.norm_weight = nullptr;
  a.rms_partials = partials;
  EXPECT_FALSE(cuda::GemvSupports(a));
  a.rms_partials = nullptr;
  a.ring = false;
  // kRopeAppendKv: every input present, then head_dim past the 256 that the shared-memory
  // cos / sin tables hold.
  alignas(16) static int32_t positions[1];
  alignas(16) static int64_t slots[1];
  alignas(16) static float inv_freq[256];
  a = cuda::GemvArgs{};
  a.x = buf, a.w = buf, a.y = buf, a.n = 1, a.k = 16;
  a.epilogue = E::kRopeAppendKv;
  a.rope.positions = positions, a.rope.slot_mapping = slots, a.rope.inv_freq = inv_freq;
  a.rope.k_cache = buf, a.rope.v_cache = buf;
  a.rope.num_heads = a.rope.num_kv_heads = 1;
  a.rope.layout.num_kv_heads = 1;
  for (int hd : {256, 260}) {
    a.rope.head_dim = hd;
    a.rope.layout.head_dim = hd;
    a.m = 3 * hd;
    EXPECT_EQ(cuda::GemvSupports(a), hd <= 256) << "head_dim " << hd;
  }
}

}  // namespace
}  // namespace llm::test::gemv
