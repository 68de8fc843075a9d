// The GPU sampler's inputs and outputs: each task's sampling parameters, logit adjustments and
// allowed-token mask (structured outputs) to the device, the sampled ids and logprobs back,
// recorded in the tasks' samplers. The masks are computed after the step's forward is
// enqueued, while the device runs it (UploadMasks; step_runner.cc's Launch says what overlaps).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
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
// max_seqs), taking each sampler's draw. The tasks with a grammar get mask rows in task order
// (SampleRowParams::mask_row); their masks are UploadMasks' (after the forward is enqueued).
// flush = false: the parameters stay staged (packed inputs) for the step's Upload to send.
void CudaWorker::UploadSampleParams(std::span<const SampleTask> tasks, size_t begin, size_t count,
                                    bool wait_inputs, bool flush) {
  if (wait_inputs) WaitInputsCopied();
  if (int64_t(count) > max_seqs) throw std::logic_error("UploadSampleParams: count > max_seqs");
  num_mask_rows = 0;
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
    r.mask_row = sm.has_grammar() ? num_mask_rows++ : -1;
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
  LLM_CUDA_CHECK(cudaEventRecord(ev_inputs, stream));
}

// The allowed-token masks of tasks [begin, begin + count) (the tasks UploadSampleParams just
// wrote; their samplers' matchers must have seen every token sampled before: ResolvePending),
// packed into h_masks in mask_row order and copied to d_masks on mask_stream. Called after the
// step's forward is enqueued on `stream`: the host computes the masks (Sampler::AllowedTokens,
// a grammar state's cached mask or a walk of the vocabulary) while the device runs the
// forward, and the copy runs beside it; EnqueueSample makes the sampling kernel wait for
// ev_masks. Nothing to do when no task has a grammar.
// On several host threads, a task at a time: a CompiledGrammar walks the masks of different
// states at once and makes a second asker of one state wait for the first
// (engine/grammar/matcher.h), so tasks of one grammar spread over the threads like any.
void CudaWorker::UploadMasks(std::span<const SampleTask> tasks, size_t begin, size_t count) {
  if (num_mask_rows == 0) return;
  const size_t words = size_t(cuda::SampleMaskWords(vocab));
  std::vector<size_t> jobs;  // the tasks with a grammar; job k fills mask row k
  for (size_t i = 0; i < count; ++i) {
    if (tasks[begin + i].sampler->has_grammar()) jobs.push_back(begin + i);
  }
  if (std::ssize(jobs) != num_mask_rows) {
    throw std::logic_error("UploadMasks: mask rows changed since upload");
  }
  Sync(ev_masks);  // the previous copy out of h_masks is done
  const auto start = Clock::now();
  const int num_jobs = int(jobs.size());
  const int num_threads = std::clamp(omp_get_num_procs() - 2, 1, std::min(num_jobs, 16));
  std::vector<std::exception_ptr> errors(jobs.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads) if (num_threads > 1)
  for (int k = 0; k < num_jobs; ++k) {
    try {
      const uint32_t* allowed = tasks[jobs[size_t(k)]].sampler->AllowedTokens();
      std::memcpy(h_masks.p + size_t(k) * words, allowed, words * sizeof(uint32_t));
    } catch (...) {
      errors[size_t(k)] = std::current_exception();
    }
  }
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  stats.mask_ms += std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  stats.mask_rows += num_mask_rows;
  // d_masks is rewritten after the last sampling kernel that read it.
  LLM_CUDA_CHECK(cudaStreamWaitEvent(mask_stream, ev_masks_read, 0));
  LLM_CUDA_CHECK(cudaMemcpyAsync(d_masks, h_masks.p,
                                 size_t(num_mask_rows) * words * sizeof(uint32_t),
                                 cudaMemcpyHostToDevice, mask_stream));
  LLM_CUDA_CHECK(cudaEventRecord(ev_masks, mask_stream));
}

// Samples tasks [begin, begin + count) from `logits` (after the forward, on stream): the
// ids into d_sampled + begin (the next step may be fed from them), everything into `o`.
// h_params.p[0, count) holds these tasks' parameters (UploadSampleParams just wrote them).
void CudaWorker::EnqueueSample(size_t begin, size_t count, OutSlot& o) {
  cuda::SampleOutputs dst = d_out;
  dst.token = d_sampled + begin;
  if (num_mask_rows > 0) LLM_CUDA_CHECK(cudaStreamWaitEvent(stream, ev_masks, 0));
  cuda::SampleTokens(logits, vocab, d_params, int64_t(count), d_adjust, d_masks, sample_ws, dst,
                     stream);
  if (num_mask_rows > 0) LLM_CUDA_CHECK(cudaEventRecord(ev_masks_read, stream));
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
    UploadMasks(tasks, begin, count);  // (the forward is enqueued: Run came first)
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
