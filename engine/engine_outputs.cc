// The engine's postprocessing: sampling from the step's logits, appending tokens, stop and
// length checks, streaming text deltas, finishing sequences and requests.
#include <algorithm>
#include <stdexcept>

#include "engine/engine.h"

namespace llm {
namespace {

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

bool IsStopToken(const Sequence& seq, const ModelConfig& mc, int token) {
  const SamplingParams& sp = seq.request->request.sampling;
  if (std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), token) !=
      sp.stop_token_ids.end()) {
    return true;
  }
  if (sp.ignore_eos) return false;
  const std::vector<int>& eos =
      mc.generation.eos_token_ids.empty() ? mc.eos_token_ids : mc.generation.eos_token_ids;
  return std::find(eos.begin(), eos.end(), token) != eos.end();
}

}  // namespace

Engine::SamplingPlan Engine::PrepareSampling(const SchedulerOutput& sched) {
  const auto now = Clock::now();
  SamplingPlan plan;
  int64_t row = 0;
  for (const ScheduledChunk& c : sched.chunks) {
    Sequence* seq = c.seq;
    RequestState* req = seq->request;
    if (!req->has_first_scheduled) {
      req->has_first_scheduled = true;
      req->first_scheduled = now;
    }
    if (!c.samples) continue;
    if (req->request.sampling.n > 1 && !req->is_forked) {
      CreateChildren(req, seq);
      plan.forked.push_back(seq);
      for (Sequence* s : req->seqs) {
        plan.tasks.push_back({row, s->sampler.get()});
        plan.task_seqs.push_back(s);
      }
    } else {
      plan.tasks.push_back({row, seq->sampler.get()});
      plan.task_seqs.push_back(seq);
    }
    ++row;
  }
  return plan;
}

void Engine::Emit(std::span<Sequence* const> task_seqs, std::span<const SampleResult> results) {
  for (size_t i = 0; i < task_seqs.size(); ++i) {
    Sequence* s = task_seqs[i];
    // Async: a sequence that finished (at the step before, or aborted) was still in this
    // step; its extra token is never emitted.
    if (s->status == SeqStatus::kFinished) continue;
    RequestState* req = s->request;
    RequestOutput out;
    out.index = s->index;
    AppendToken(s, results[i], &out);
    if (out.finish_reason == FinishReason::kNone && (!out.token_ids.empty() || !out.text.empty())) {
      req->channel->Push(std::move(out));
    } else if (out.finish_reason != FinishReason::kNone) {
      EmitLastIfDone(req, &out);
    }
  }
}

// n > 1: completions 1..n-1 exist (their samplers take this step's logits row) before their
// blocks do; StartChildren gives them the parent's blocks once its prompt KV is computed.
void Engine::CreateChildren(RequestState* req, Sequence* parent) {
  req->is_forked = true;
  for (int i = 1; i < req->request.sampling.n; ++i) NewSequence(req, i, parent->token_ids);
}

void Engine::StartChildren(Sequence* parent) {
  for (Sequence* child : parent->request->seqs) {
    if (child == parent) continue;
    child->num_computed_tokens = parent->num_computed_tokens;
    blocks_.Fork(parent->id, child->id);
    scheduler_.AddRunning(child);
  }
}

void Engine::AppendToken(Sequence* seq, const SampleResult& sample, RequestOutput* out) {
  RequestState* req = seq->request;
  if (!req->has_first_token) {
    req->has_first_token = true;
    req->first_token = Clock::now();
  }
  const int token = sample.token;
  // The oldest placeholder (MarkLaunched) becomes the token, in the block manager too when
  // a later step already appended it there.
  const int64_t position = seq->num_known_tokens();
  if (seq->num_pending <= 0) throw std::logic_error("Engine: a token without a placeholder");
  seq->token_ids[static_cast<size_t>(position)] = token;
  --seq->num_pending;
  if (blocks_.Has(seq->id) && position < blocks_.NumTokens(seq->id)) {
    blocks_.SetToken(seq->id, position, token);
  }
  ++counters_.num_generated_tokens;
  const SamplingParams& sp = req->request.sampling;
  if (IsStopToken(*seq, executor_->config(), token)) {
    FinishSequence(seq, FinishReason::kStop, out);  // the stop token itself is not emitted
    return;
  }
  out->token_ids.push_back(token);
  if (sp.logprobs) {
    out->logprobs.push_back({token, sample.logprob.value_or(0.f), sample.top_logprobs});
  }
  const StopStringMatcher::Result text = seq->stop->Push(seq->decoder->Push(token));
  out->text += text.text;
  if (text.stopped) {
    seq->finish_reason = FinishReason::kStop;  // text already cut at the stop string
    FinishSequence(seq, FinishReason::kStop, out);
    return;
  }
  if (seq->num_known_tokens() - seq->num_prompt_tokens >= sp.max_tokens ||
      seq->num_known_tokens() >= executor_->config().max_position_embeddings) {
    FinishSequence(seq, FinishReason::kLength, out);
  }
}

void Engine::FinishSequence(Sequence* seq, FinishReason reason, RequestOutput* out) {
  // Release the text held back for UTF-8 or stop-string matching, unless a stop string
  // already ended the text.
  if (seq->finish_reason == FinishReason::kNone) {
    const StopStringMatcher::Result tail = seq->stop->Push(seq->decoder->Flush());
    out->text += tail.text;
    if (!tail.stopped) out->text += seq->stop->Flush();
  }
  seq->token_ids.resize(static_cast<size_t>(seq->num_known_tokens()));  // async placeholders
  seq->num_pending = 0;
  seq->finish_reason = reason;
  seq->status = SeqStatus::kFinished;
  out->index = seq->index;
  out->finish_reason = reason;
  scheduler_.Remove(seq);
  ++seq->request->num_finished;
}

void Engine::EmitLastIfDone(RequestState* req, RequestOutput* out) {
  const bool all_created = req->is_forked || req->request.sampling.n == 1;
  if (all_created && req->num_finished == std::ssize(req->seqs)) {
    const auto now = Clock::now();
    out->is_last = true;
    out->usage.prompt_tokens = std::ssize(req->request.prompt_ids);
    out->usage.cached_prompt_tokens = req->cached_prompt_tokens;
    for (const Sequence* s : req->seqs) out->usage.completion_tokens += s->num_output_tokens();
    if (req->has_first_scheduled) out->queue_seconds = Seconds(req->arrival, req->first_scheduled);
    if (req->has_first_token) out->first_token_seconds = Seconds(req->arrival, req->first_token);
    out->total_seconds = Seconds(req->arrival, now);
  }
  const bool is_last = out->is_last;
  const std::string id = req->request.request_id;
  req->channel->Push(std::move(*out));
  if (!is_last) return;
  ++counters_.num_finished_requests;
  Bury(req);  // out of requests_ and seqs_; freed once no launched step refers to it
  ReleaseId(id);
}

// Abort, timeout or error: every unfinished completion of the request ends with `reason`.
void Engine::FinishRequest(RequestState* req, FinishReason reason, const std::string& error) {
  // n > 1 ended before its prompt was computed (a timeout or abort in the queue or in
  // prefill): choices 1..n-1 have no sequence yet, yet each still gets its one final event.
  if (!req->is_forked) {
    for (int i = 1; i < req->request.sampling.n; ++i) {
      RequestOutput out;
      out.index = i;
      out.error = error;
      out.finish_reason = reason;
      req->channel->Push(std::move(out));
    }
  }
  req->is_forked = true;  // no children will be created any more
  std::vector<Sequence*> open;
  for (Sequence* s : req->seqs) {
    if (s->status != SeqStatus::kFinished) open.push_back(s);
  }
  for (Sequence* s : open) {
    RequestOutput out;
    out.error = error;
    s->finish_reason = reason;  // no flush of held-back text after an abort
    FinishSequence(s, reason, &out);
    EmitLastIfDone(req, &out);
  }
}

}  // namespace llm
