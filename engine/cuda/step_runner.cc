// A step end to end on the worker: Run (upload, hand the step to the peers, enqueue the graph or
// the eager forward), the step's device span and timing, and asynchronous steps (Launch / Wait,
// two in flight).
#include <algorithm>
#include <chrono>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cuda/cuda_worker.h"

namespace llm {

// Runs the model for `b`; the logits of its rows are in `logits` afterwards (on stream).
// Fed tokens (async) are gathered from d_sampled into d_tokens first, outside any graph:
// the graph reads d_tokens like any other input buffer.
// Tensor parallel: rank 0 uploads (and so validates) the batch first, then hands it to the
// peers, which run the same Run on their GPUs: every rank takes the same graph / eager
// decision and enqueues the same collectives in the same order.
void CudaWorker::Run(const ForwardBatch& b, bool wait_inputs) {
  if (b.num_tokens() == 0) throw Error("Forward: no tokens");
  last_step_tokens = b.num_tokens();
  if (shard.rank > 0 && peer_step_observer) peer_step_observer->BeforeStep(shard.rank, b);
  CheckPeers();
  const bool graph = GraphEligible(b);
  const int64_t padded = graph ? PaddedBatch(b.num_seqs()) : 0;
  const int64_t width =
      graph ? GraphWidth(b.max_blocks_per_seq) : std::max<int64_t>(1, b.max_blocks_per_seq);
  const Shape s = Upload(b, padded, width, wait_inputs);
  if (drive_peers) {
    auto copy = std::make_shared<const ForwardBatch>(b);
    PostToPeers([copy](CudaWorker& peer) { peer.Run(*copy); });
    // From here on the peers enqueue this step's collectives: a failure on this rank
    // would leave them unpaired, so it is fatal (and the communicators are aborted).
    try {
      Enqueue(s, graph, padded);
    } catch (const FatalExecutorError&) {
      AbortComms();
      throw;
    } catch (const std::exception& e) {
      AbortComms();
      throw FatalExecutorError(std::string("tensor-parallel rank 0 failed mid-step: ") + e.what());
    }
  } else {
    Enqueue(s, graph, padded);
  }
  ++stats.steps;
}

// The device work of a step uploaded as `s`: the fed tokens' gather (and broadcast), then
// the decode graph or the eager forward.
void CudaWorker::Enqueue(const Shape& s, bool graph, int64_t padded) {
  if (s.has_feed) {
    if (shard.rank == 0) {
      cuda::FeedSampledTokens(d_tokens, d_feed, d_sampled, s.num_tokens, stream);
    }
    BroadcastTokens(s.num_tokens);
  }
  if (OverlapStep(s)) ++stats.decode_overlap_steps;
  if (graph) {
    const auto key = std::make_tuple(padded, s.splits, s.width);
    auto it = graphs.find(key);
    if (it == graphs.end()) it = graphs.emplace(key, Capture(s)).first;
    LLM_CUDA_CHECK(cudaGraphLaunch(it->second, stream));
    ++stats.graph_steps;
  } else {
    RunModel(s);
  }
}

// The decode-only counters' share of step `b` (CudaExecutorStats::decode_*): keys the decode
// attention reads per layer, context_len + 1 per sequence; a sliding layer reads at most its
// window (paged_kv.h: VisibleKeyBegin), so with such layers a sequence counts the mean over the
// layers, rounded to the nearest key.
CudaWorker::StepTally CudaWorker::Tally(const ForwardBatch& b) const {
  StepTally t;
  t.is_decode_only = b.num_seqs() > 0 && b.num_decode_seqs == b.num_seqs();
  if (!t.is_decode_only) return t;
  t.num_seqs = b.num_seqs();
  const int64_t num_layers = config.num_layers;
  const int64_t window = config.sliding_window.value_or(0);
  int64_t num_sliding = 0;
  for (int64_t l = 0; l < num_layers && window > 0; ++l)
    num_sliding += config.SlidingWindowOf(l) > 0;
  for (const int32_t context_len : b.context_lens) {
    const int64_t keys = int64_t(context_len) + 1;
    if (num_sliding == 0) {
      t.num_kv_tokens_read += keys;
    } else {
      const int64_t layer_keys =
          (num_layers - num_sliding) * keys + num_sliding * std::min(keys, window);
      t.num_kv_tokens_read += (layer_keys + num_layers / 2) / num_layers;
    }
  }
  return t;
}

// Starts a step's device span on the stream, and notes what the step is for FinishTiming.
void CudaWorker::StartTiming(OutSlot& o, const ForwardBatch& b) {
  o.tally = Tally(b);
  LLM_CUDA_CHECK(cudaEventRecord(o.start, stream));
}

// Ends a step's device span (call after its last device-to-host copy is enqueued) and
// waits for it.
void CudaWorker::StopAndWait(OutSlot& o) {
  LLM_CUDA_CHECK(cudaEventRecord(o.stop, stream));
  Sync(o.stop);
}

// Device time of the step between o.start and o.stop (each event completes when the stream
// reaches it, so an async step's span starts after the step before it: spans never
// overlap, and their sum over a run's wall time is the device-busy fraction); host time
// spent inside the executor's calls.
void CudaWorker::FinishTiming(const OutSlot& o, double host_ms) {
  float ms = 0;
  LLM_CUDA_CHECK(cudaEventElapsedTime(&ms, o.start, o.stop));
  stats.device_ms += ms;
  stats.wall_ms += host_ms;
  if (o.tally.is_decode_only) {
    ++stats.decode_steps;
    stats.decode_device_ms += ms;
    stats.decode_seq_steps += o.tally.num_seqs;
    stats.decode_kv_tokens_read += o.tally.num_kv_tokens_read;
  }
}

// Order on the stream: sampling parameters and batch inputs (host to device), the fed
// tokens' gather, the forward (graph or eager), [the wait for ev_masks], the sampler, the
// copies back, o.stop. Nothing waits for the device here, except for the previous step's
// input copies, and, when a task has a grammar, for the previous step's tokens:
//
// Structured outputs. A mask for step N+1 depends on the token sampled at step N, but the
// forward of N+1 does not (its fed tokens are gathered on the device), so the engine launches
// N+1 with N in flight (async scheduling) as for any request, and this launch orders it so:
//     host:    upload N+1 ─ enqueue forward N+1 ─ wait for N ─ read N's tokens into the
//              matchers ─ compute N+1's masks ─ copy them (mask_stream) ─ enqueue sample N+1
//     device:  ... forward N ─ sample N ─ forward N+1 ─────────────────── sample N+1
//     copy engine:                                  h_masks -> d_masks ─┘ (ev_masks)
// The masks are computed on the host while the device runs N+1's forward (the wait for N
// ends when N's sampling does, which is when the device starts N+1's forward), and their copy
// runs beside it; the sampling kernel waits for ev_masks only. The device idles only when
// reading N and computing the masks take longer than the forward. N's results are kept for
// Wait(N), which the engine calls next (ResolvePending). The tokens are exactly those of a
// synchronous step: every mask is computed from the same matcher state, and the draws are
// taken in launch order either way.
StepHandle CudaWorker::Launch(const ForwardBatch& b, std::span<const SampleTask> tasks) {
  const auto host_start = Clock::now();
  last_step_tokens = b.num_tokens();
  if (pending.size() >= 2) {
    throw std::logic_error("CUDA executor: at most two steps in flight (Wait first)");
  }
  PendingStep p;
  p.id = next_step_id++;
  p.slot = pending.empty() ? 0 : 1 - pending.back().slot;
  OutSlot& o = out[p.slot];
  p.tasks.assign(tasks.begin(), tasks.end());
  const bool has_grammar = HasGrammar(tasks);
  if (int64_t(tasks.size()) > max_seqs) {  // rounds of max_seqs: synchronous
    StartTiming(o, b);
    Run(b);
    if (has_grammar) ResolvePending();
    p.results = Sample(tasks, o);
    p.has_results = true;
  } else {
    if (b.num_tokens() == 0) throw Error("Forward: no tokens");
    // The one wait of a launch: the previous step's input copies (at the head of what the
    // stream still holds), not its forward. The copies enqueued below may not be waited
    // for again before the forward: they sit behind the previous step's work.
    WaitInputsCopied();
    DiscardStaged();  // (what a failed launch left staged)
    StartTiming(o, b);
    if (!tasks.empty()) {
      UploadSampleParams(tasks, 0, tasks.size(), /*wait_inputs=*/false, /*flush=*/false);
      if (!opt.async_masks) UploadMasks(tasks, 0, tasks.size());  // the baseline: before Run
    }
    p.num_logprobs.resize(tasks.size());
    for (size_t i = 0; i < tasks.size(); ++i) p.num_logprobs[i] = h_params.p[i].num_logprobs;
    try {
      Run(b, /*wait_inputs=*/false);  // validates fed rows against num_last_sampled
      num_last_sampled = int64_t(tasks.size());
      if (has_grammar && opt.async_masks) {
        ResolvePending();
        UploadMasks(tasks, 0, tasks.size());
      }
      if (!tasks.empty()) EnqueueSample(0, tasks.size(), o);
      LLM_CUDA_CHECK(cudaEventRecord(o.stop, stream));
    } catch (...) {
      DiscardStaged();
      // Nothing was sampled: give back the draw each task took above (executor.h).
      for (const SampleTask& t : tasks) t.sampler->UndoDraws(1);
      throw;
    }
  }
  pending.push_back(std::move(p));
  stats.wall_ms += std::chrono::duration<double, std::milli>(Clock::now() - host_start).count();
  return {pending.back().id};
}

bool CudaWorker::HasGrammar(std::span<const SampleTask> tasks) {
  return std::any_of(tasks.begin(), tasks.end(),
                     [](const SampleTask& t) { return t.sampler->has_grammar(); });
}

// Reads back the results of every launched step not read yet (waiting for each), recording
// their tokens in the samplers, and keeps them for Wait: a launch whose masks need the
// tokens of the step before it calls this after enqueueing its own forward.
void CudaWorker::ResolvePending() {
  for (PendingStep& q : pending) {
    if (q.has_results) continue;
    const OutSlot& o = out[q.slot];
    Sync(o.stop);  // (a failure here leaves q for Wait, which fails the same way)
    q.results.resize(q.tasks.size());
    q.has_results = true;
    try {
      ReadSampleResults(q.tasks, 0, q.tasks.size(), q.num_logprobs.data(), o, &q.results);
    } catch (...) {
      q.error = std::current_exception();  // Wait(q) throws it: q's samplers saw a part
    }
  }
}

std::vector<SampleResult> CudaWorker::Wait(StepHandle step) {
  const auto host_start = Clock::now();
  if (pending.empty() || pending.front().id != step.id) {
    throw std::logic_error("CUDA executor: Wait for step " + std::to_string(step.id) +
                           ", which is not the oldest launched step");
  }
  PendingStep p = std::move(pending.front());
  pending.pop_front();
  OutSlot& o = out[p.slot];
  std::vector<SampleResult> results;
  if (p.error) std::rethrow_exception(p.error);
  if (p.has_results) {
    results = std::move(p.results);
  } else {
    Sync(o.stop);
    results.resize(p.tasks.size());
    ReadSampleResults(p.tasks, 0, p.tasks.size(), p.num_logprobs.data(), o, &results);
  }
  const double host_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - host_start).count();
  FinishTiming(o, host_ms);
  return results;
}

// The synchronous calls use slot 0; they may not run while async steps are in flight.
void CudaWorker::CheckNothingInFlight(const char* what) const {
  if (!pending.empty()) {
    throw std::logic_error(std::string("CUDA executor: ") + what +
                           " while launched steps are not waited for");
  }
}

}  // namespace llm
