// Decode CUDA graphs: which steps replay one, its padded batch and table width, the capture,
// and the graphs captured at start-up.
#include <algorithm>
#include <chrono>
#include <string>
#include <tuple>

#include "engine/cuda/cuda_worker.h"

namespace llm {

// Graph-eligible: decode rows only, each wanting its logits in order.
bool CudaWorker::GraphEligible(const ForwardBatch& b) const {
  if (!opt.cuda_graphs || graph_sizes.empty() || b.is_batch_invariant) return false;
  const int64_t ns = b.num_seqs();
  if (ns == 0 || b.num_decode_seqs != ns || ns > graph_sizes.back()) return false;
  if (int64_t(b.logits_indices.size()) != ns) return false;
  for (int64_t i = 0; i < ns; ++i)
    if (b.logits_indices[size_t(i)] != i) return false;
  return true;
}

int64_t CudaWorker::PaddedBatch(int64_t ns) const {
  return *std::lower_bound(graph_sizes.begin(), graph_sizes.end(), ns);
}

int64_t CudaWorker::GraphWidth(int64_t max_blocks) const {
  return std::min(table_cap, std::max(kMinTableWidth, NextPow2(max_blocks)));
}

cudaGraphExec_t CudaWorker::Capture(const Shape& s) {
  cudaGraph_t graph = nullptr;
  LLM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  try {
    RunModel(s);
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  LLM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  LLM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  LLM_CUDA_CHECK(cudaGraphDestroy(graph));
  ++stats.graphs_captured;
  return exec;
}

// GEMM tuning at start-up (opt.gemm_autotune): one GPU, on its own stream's passes.
bool CudaWorker::Tuning() const { return opt.gemm_autotune && shard.size == 1; }

// Captures the decode graphs for short contexts (split count 1, narrowest table). With
// tuning, each batch size that runs GEMMs first runs once eagerly (the same kernels on the
// same empty inputs the capture records), timing its GEMM shapes' candidates.
void CudaWorker::CaptureStartupGraphs() {
  if (!opt.cuda_graphs) return;
  const auto start = Clock::now();
  for (int64_t padded : graph_sizes) {
    ForwardBatch empty;
    Shape s = Upload(empty, padded, kMinTableWidth);
    s.splits = 1;
    const auto key = std::make_tuple(padded, s.splits, s.width);
    if (graphs.count(key)) continue;
    if (Tuning() && !SmallStep(padded)) {
      struct TuningOn {  // off again on every path
        cuda::Gemm& g;
        explicit TuningOn(cuda::Gemm& gemm) : g(gemm) { g.set_tuning(true); }
        ~TuningOn() { g.set_tuning(false); }
      } on(*gemm);
      RunModel(s);
    }
    graphs.emplace(key, Capture(s));
  }
  LLM_CUDA_CHECK(cudaStreamSynchronize(stream));
  Log("captured " + std::to_string(graphs.size()) + " decode CUDA graphs (batch 1.." +
      std::to_string(graph_sizes.back()) + ") in " +
      std::to_string(std::chrono::duration<double>(Clock::now() - start).count()).substr(0, 5) +
      " s" +
      (Tuning() ? "; GEMM algorithms timed for " + std::to_string(gemm->num_tuned()) + " shapes, " +
                      std::to_string(gemm->num_retuned()) + " faster than cuBLASLt's first pick"
                : std::string()));
}

}  // namespace llm
