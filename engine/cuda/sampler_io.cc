// The GPU sampler's inputs and outputs: each task's sampling parameters, logit adjustments and
// allowed-token mask (structured outputs) to the device, the sampled ids and logprobs back,
// recorded in the tasks' samplers.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cuda/cuda_worker.h"

namespace llm {

static_assert(sizeof(TokenAdjust) == sizeof(cuda::LogitAdjust) &&
                  offsetof(TokenAdjust, token) == offsetof(cuda::LogitAdjust, token) &&
                  offsetof(TokenAdjust, bias) == offsetof(cuda::LogitAdjust, bias) &&
                  offsetof(TokenAdjust, repetition) == offsetof(cuda::LogitAdjust, repetition) &&
                  offsetof(TokenAdjust, subtract) == offsetof(cuda::LogitAdjust, subtract),
              "the host's TokenAdjust is copied to the device as LogitAdjust");

// Fills and uploads the sampling parameters of tasks [begin, begin + count) (count <=
// max_seqs), taking each sampler's draw. The masks of the tasks with a grammar are packed into
// h_masks (rows in task order, mask_row their index) and copied only when some task has one.
// flush = false: the parameters stay staged (packed inputs) for the step's Upload to send.
void CudaWorker::UploadSampleParams(std::span<const SampleTask> tasks, size_t begin, size_t count,
                                    bool wait_inputs, bool flush) {
  if (wait_inputs) WaitInputsCopied();
  if (int64_t(count) > max_seqs) throw std::logic_error("UploadSampleParams: count > max_seqs");
  const size_t words = size_t(cuda::SampleMaskWords(vocab));
  int32_t num_masked = 0;
  std::vector<TokenAdjust> adjust;
  for (size_t i = 0; i < count; ++i) {
    Sampler& sm = *tasks[begin + i].sampler;
    const SamplingParams& sp = sm.params();
    cuda::SampleRowParams& r = h_params.p[i];
    r.logits_row = int32_t(tasks[begin + i].logits_row);
    r.temperature = float(sp.temperature);
    r.top_k = sp.top_k;
    r.top_p = float(sp.top_p);
    r.min_p = float(sp.min_p);
    r.seed = sm.device_seed();
    r.offset = sm.TakeDraw();
    r.num_logprobs = sp.logprobs ? *sp.logprobs : -1;
    r.adjust_begin = int32_t(adjust.size());
    sm.AppendAdjustments(vocab, &adjust);
    r.adjust_end = int32_t(adjust.size());
    r.mask_row = -1;
    if (const uint32_t* allowed = sm.AllowedTokens()) {
      std::memcpy(h_masks.p + size_t(num_masked) * words, allowed, words * sizeof(uint32_t));
      r.mask_row = num_masked++;
    }
  }
  ReserveAdjust(int64_t(adjust.size()));
  for (size_t i = 0; i < adjust.size(); ++i) {
    h_adjust.p[i] = {adjust[i].token, adjust[i].bias, adjust[i].repetition, adjust[i].subtract};
  }
  CopyIn(d_params, h_params.p, int64_t(count * sizeof(cuda::SampleRowParams)));
  if (flush) FlushStaged();
  if (!adjust.empty()) {
    LLM_CUDA_CHECK(cudaMemcpyAsync(d_adjust, h_adjust.p, adjust.size() * sizeof(TokenAdjust),
                                   cudaMemcpyHostToDevice, stream));
  }
  if (num_masked > 0) {  // (ev_inputs below keeps h_masks until the copy is done)
    LLM_CUDA_CHECK(cudaMemcpyAsync(d_masks, h_masks.p,
                                   size_t(num_masked) * words * sizeof(uint32_t),
                                   cudaMemcpyHostToDevice, stream));
  }
  LLM_CUDA_CHECK(cudaEventRecord(ev_inputs, stream));
}

// Samples tasks [begin, begin + count) from `logits` (after the forward, on stream): the
// ids into d_sampled + begin (the next step may be fed from them), everything into `o`.
// h_params.p[0, count) holds these tasks' parameters (UploadSampleParams just wrote them).
void CudaWorker::EnqueueSample(size_t begin, size_t count, OutSlot& o) {
  cuda::SampleOutputs dst = d_out;
  dst.token = d_sampled + begin;
  cuda::SampleTokens(logits, vocab, d_params, int64_t(count), d_adjust, d_masks, sample_ws, dst,
                     stream);
  auto back = [&](void* host, const void* src, size_t bytes) {
    LLM_CUDA_CHECK(cudaMemcpyAsync(host, src, bytes, cudaMemcpyDeviceToHost, stream));
  };
  back(o.token.p, dst.token, count * 4);
  // The logprob outputs only when a task asked for them (ReadSampleResults reads them only
  // then): one copy back per step instead of four in the common case (~3 µs each).
  bool logprobs = false;
  for (size_t i = 0; i < count; ++i) logprobs |= h_params.p[i].num_logprobs >= 0;
  if (!logprobs) return;
  back(o.logprob.p, d_out.logprob, count * 4);
  back(o.top_ids.p, d_out.top_ids, count * cuda::kMaxTopLogprobs * 4);
  back(o.top_lp.p, d_out.top_logprobs, count * cuda::kMaxTopLogprobs * 4);
}

// The results of tasks [begin, begin + count) from `o` (copied back), recorded in their
// samplers for the penalties (their draws were taken at upload).
void CudaWorker::ReadSampleResults(std::span<const SampleTask> tasks, size_t begin, size_t count,
                                   const int32_t* num_logprobs, const OutSlot& o,
                                   std::vector<SampleResult>* results) {
  for (size_t i = 0; i < count; ++i) {
    SampleResult& res = (*results)[begin + i];
    res.token = o.token.p[i];
    const int n = num_logprobs[i];
    if (n >= 0) {
      res.logprob = o.logprob.p[i];
      for (int k = 0; k < std::min(n, int(vocab)); ++k) {
        res.top_logprobs.push_back({o.top_ids.p[i * cuda::kMaxTopLogprobs + size_t(k)],
                                    o.top_lp.p[i * cuda::kMaxTopLogprobs + size_t(k)]});
      }
    }
    tasks[begin + i].sampler->Observe(res.token);
  }
}

// Samples every task after the forward and waits: in rounds of max_seqs tasks (n > 1 can
// ask for more), each round's pinned buffers read before the next reuses them.
std::vector<SampleResult> CudaWorker::Sample(std::span<const SampleTask> tasks, OutSlot& o) {
  if (int64_t(tasks.size()) > sampled_cap) {
    throw Error("CUDA executor: " + std::to_string(tasks.size()) +
                " samples in one step exceed what was sized at start-up (" +
                std::to_string(sampled_cap) + ")");
  }
  std::vector<SampleResult> results(tasks.size());
  num_last_sampled = int64_t(tasks.size());
  if (tasks.empty()) StopAndWait(o);
  std::vector<int32_t> num_logprobs;
  for (size_t begin = 0; begin < tasks.size(); begin += size_t(max_seqs)) {
    const size_t count = std::min(tasks.size() - begin, size_t(max_seqs));
    UploadSampleParams(tasks, begin, count);
    num_logprobs.resize(count);
    for (size_t i = 0; i < count; ++i) num_logprobs[i] = h_params.p[i].num_logprobs;
    EnqueueSample(begin, count, o);
    if (begin + count == tasks.size()) {
      StopAndWait(o);
    } else {
      SyncStream();  // the pinned buffers are reused
    }
    ReadSampleResults(tasks, begin, count, num_logprobs.data(), o, &results);
  }
  return results;
}

}  // namespace llm
