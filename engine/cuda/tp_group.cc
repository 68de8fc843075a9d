// The tensor-parallel group: rank 0's peers and their worker threads, the collectives of a step
// (NCCL or the one-shot peer-access all-reduce), and the aborts and polling waits that keep a
// failed rank from leaving the others blocked.
#include <cuda_runtime.h>

#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/cuda/cuda_worker.h"

namespace llm {

void CudaWorker::AllReduceResidual(int64_t tokens) {
  if (shard.size == 1) return;
  const int64_t count = tokens * hidden;
  if (p2p_ok && count <= cuda::kP2PFasterThanNccl && count % 4 == 0) {
    cuda::P2PAllReduce(p2p, count, stream);
    return;
  }
#if defined(LLM_HAS_NCCL)
  std::lock_guard<std::timed_mutex> lock(comm_mu);
  ThrowIfAborted();
  LLM_NCCL_CHECK(ncclAllReduce(x, x, size_t(count), ncclFloat32, ncclSum, comm, stream));
#endif
}

void CudaWorker::ThrowIfAborted() const {
  if (comms_aborted) {
    throw FatalExecutorError("tensor parallel: the communicators were aborted after a failure");
  }
}

// The step's token ids, from rank 0 (where async scheduling's fed tokens are gathered).
void CudaWorker::BroadcastTokens([[maybe_unused]] int64_t tokens) {
  if (shard.size == 1) return;
#if defined(LLM_HAS_NCCL)
  std::lock_guard<std::timed_mutex> lock(comm_mu);
  ThrowIfAborted();
  LLM_NCCL_CHECK(ncclBroadcast(d_tokens, d_tokens, size_t(tokens), ncclInt32, 0, comm, stream));
#endif
}

// Waits for `ev`; with peers, polls, so that a failed peer ends the wait with an error
// instead of a collective that never completes.
void CudaWorker::Sync(cudaEvent_t ev) {
  if (peers.empty()) {
    LLM_CUDA_CHECK(cudaEventSynchronize(ev));
    return;
  }
  for (;;) {
    const cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) {
      // Work that completed after a rank failed may have summed garbage (an aborted
      // all-reduce): it is not a result.
      CheckPeers();
      return;
    }
    if (q != cudaErrorNotReady) LLM_CUDA_CHECK(q);
    CheckPeers();
    std::this_thread::yield();
  }
}

void CudaWorker::SyncStream() {
  if (peers.empty()) {
    LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
    return;
  }
  LLM_CUDA_CHECK(cudaEventRecord(ev_sync, stream));
  Sync(ev_sync);
}

CudaWorker::~CudaWorker() {
  // The peers drain their queues and release their resources while this rank releases its
  // own: each NCCL communicator is destroyed by its own thread, all at once.
  for (auto& p : peers) {
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->quit = true;
    }
    p->cv.notify_one();
  }
  Release();
  for (auto& p : peers) {
    if (p->thread.joinable()) p->thread.join();
  }
  if (!comms_aborted) cuda::DestroyP2PAllReduce(p2p_group);  // every stream is idle by now
}

void CudaWorker::PostToPeers(std::function<void(CudaWorker&)> job) {
  for (auto& p : peers) p->Post(job);
}

void CudaWorker::RunOnAllRanks(const std::function<void(CudaWorker&)>& f) {
  std::vector<std::shared_ptr<std::promise<void>>> done;
  for (auto& p : peers) {
    auto promise = std::make_shared<std::promise<void>>();
    done.push_back(promise);
    p->Post([f, promise](CudaWorker& peer) {
      try {
        f(peer);
        promise->set_value();
      } catch (...) {
        promise->set_exception(std::current_exception());
        throw;  // recorded by the worker too: rank 0's waits see it (CheckPeers) and abort
      }
    });
  }
  std::exception_ptr first;
  try {
    f(*this);
  } catch (...) {
    first = std::current_exception();
    AbortComms();
  }
  for (size_t i = 0; i < done.size(); ++i) {
    std::future<void> fut = done[i]->get_future();
    // A failed rank leaves the others waiting in a collective: abort them all.
    while (!first && fut.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
      for (auto& p : peers) {
        if (p->Failure()) AbortComms();
      }
    }
    try {
      fut.get();
    } catch (...) {
      if (!first) first = std::current_exception();
      AbortComms();
    }
  }
  if (first) std::rethrow_exception(first);
}

// The one-shot all-reduce's buffers on every rank (kernels/cuda/all_reduce/all_reduce.h), or NCCL
// only where a pair of GPUs has no peer access. Rank 0 owns them (p2p_group) and frees them last.
void CudaWorker::SetupP2P(const std::vector<CudaWorker*>& ranks) {
  p2p_group = cuda::CreateP2PAllReduce(int(ranks.size()));
  if (p2p_group.empty()) {
    Log("no peer access between every pair of GPUs: every all-reduce over NCCL");
    return;
  }
  for (CudaWorker* m : ranks) {
    m->p2p = p2p_group[size_t(m->shard.rank)];
    m->p2p.buf = m->x;
    m->p2p_ok = true;
  }
}

void CudaWorker::AbortComms() {
  if (comms_aborted.exchange(true)) return;
  // Every rank leaves its device state alone from now on (Release), and no rank's thread
  // starts another NCCL call (ThrowIfAborted under comm_mu).
  for (auto& p : peers) p->impl->comms_aborted = true;
  cuda::AbortP2PAllReduce(p2p_group);
#if defined(LLM_HAS_NCCL)
  std::vector<CudaWorker*> ranks = {this};
  for (auto& p : peers) ranks.push_back(p->impl.get());
  for (CudaWorker* r : ranks) {
    std::unique_lock<std::timed_mutex> lock(r->comm_mu, std::defer_lock);
    const bool idle = lock.try_lock_for(std::chrono::seconds(1));
    if (r->comm) ncclCommAbort(r->comm);  // also releases a call blocked inside NCCL
    if (idle) r->comm = nullptr;          // else its thread owns the pointer; teardown leaks it
  }
#endif
}

void CudaWorker::CheckPeers() {
  for (auto& p : peers) {
    std::exception_ptr e = p->Failure();
    if (!e) continue;
    AbortComms();
    throw FatalExecutorError("tensor-parallel rank " + std::to_string(p->impl->shard.rank) +
                             " failed: " + ExceptionMessage(e));
  }
}
}  // namespace llm
