// Choosing and building the model backend for `llm serve`, `llm bench` and `llm generate`:
// --device cpu|cuda|auto, --dtype, --load-format auto|dummy, --gpu-memory-utilization,
// --enforce-eager, --async-scheduling, --tensor-parallel-size, --kv-cache-dtype, --quantization
// (vLLM's names). The result is a ModelExecutor for the Engine.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <optional>
#include <string>

#include "engine/cpu/cpu_model.h"
#include "engine/engine.h"
#include "engine/executor.h"

namespace llm::cli {

struct BackendFlags {
  std::string device = "auto";  // auto: cuda when a GPU is present and the model fits it
  std::string dtype = "auto";   // cpu: weights as stored / f32 / bf16 / f16; cuda: bf16 / f16
  std::string load_format = "auto";
  double gpu_memory_utilization = 0.90;
  bool enforce_eager = false;              // no CUDA graphs
  int64_t gemv_max_tokens = 8;             // cuda: steps up to this many tokens use the GEMV kernel
  int64_t decode_min_tiles_per_split = 1;  // cuda: the decode attention's split selector
  bool packed_step_inputs = true;          // cuda: one packed host-to-device copy per step
  bool async_masks = true;        // cuda: grammar steps stay in flight, masks beside the forward
  bool fp8_prefill_wgmma = true;  // cuda, fp8 KV: prefill on wgmma over a bf16 copy of pages
  bool gemm_autotune = false;     // cuda: time cuBLASLt's candidate algorithms at start-up
  bool disable_pdl = false;       // cuda: no programmatic dependent launch
  bool decode_kv_before_wait = true;  // cuda: decode attention's prologue before its PdlWait
  bool gemv_norm_prologue = false;    // cuda: RMSNorm in the GEMV's prologue on GEMV steps
  bool gemv_fold_norm = false;        // cuda: the RMSNorms folded into the GEMVs around them
  bool gemv_chain = false;            // cuda: o, gate|up, down in one kernel (implies the fold)
  bool gemv_balanced_grid = false;    // cuda: GEMV grids of equal shares per CTA
  bool decode_overlap = false;        // cuda: decode steps as two halves on two streams
  int decode_overlap_gemm_sms = 0;    // cuda: --decode-overlap's GEMMs sized for this many SMs
  bool gemv_ring = false;
  int gemv_ring_kib = 96;          // cuda: GEMV steps on the ring kernel (cuda::GemvArgs::ring)
  bool rope_head_warps = true;     // cuda: RoPE with per-head norms, one warp per head
  bool fp8_precise_accum = false;  // cuda, --quantization fp8: cuBLASLt's precise FP8 accumulation
  bool moe_combine_in_norm = false;  // cuda, MoE, small steps: the experts' sum in the next norm
  std::string moe_kernels = "v5";    // cuda, mixture of experts: kernels/cuda/moe/moe.h's set
  uint64_t dummy_seed = 0;
  int tensor_parallel_size = 1;            // cuda: GPUs 0..N-1, one shard each over NCCL
  std::string kv_cache_dtype = "auto";     // auto (cpu f32, cuda the model dtype) or fp8 (cpu)
  bool disable_custom_all_reduce = false;  // cuda, N > 1: NCCL for every all-reduce
  std::string quantization = "none";       // none, or fp8: FP8 e4m3 linear weights
  // vLLM's --async-scheduling: schedule step N+1 while step N runs (EngineConfig).
  // Unset: on for cuda (measured: GPU busy 0.94 -> 0.998 at 256 sequences), off for cpu.
  std::optional<bool> async_scheduling;

  void AddTo(CLI::App* cmd);
};

struct Backend {
  std::unique_ptr<CpuModel> cpu_model;  // the CPU backend's weights (null on cuda)
  std::unique_ptr<ModelExecutor> executor;
  std::string device;  // "cpu" or "cuda"
};

// True when this build has the CUDA backend and a GPU can be used.
bool CudaDevicePresent();

// Throws llm::Error for flags only the CUDA backend takes (--load-format dummy,
// --tensor-parallel-size > 1), for paths that run the CPU backend.
void CheckCpuFlags(const BackendFlags& flags);

// The CPU backend's LoadOptions from --dtype and --quantization.
LoadOptions CpuLoadOptions(const BackendFlags& flags);

// Builds the backend for `model_path` (a model folder; with --load-format dummy also a
// config .json). On the CPU the KV pool comes from engine.kv_cache_bytes; on the GPU from the
// memory left, and `engine` is adjusted to what the GPU path wants (no batch-invariant
// routing: decode rows take the split-KV kernel). Throws llm::Error with a clear message.
Backend MakeBackend(const std::string& model_path, const BackendFlags& flags, EngineConfig* engine);

// --kv-reserve-ratio and --kv-reserve-min-ratio (engine/sched/scheduler.h: admission's KV
// headroom) into `engine`, for `llm serve` and `llm bench`.
void AddKvReserveOptions(CLI::App* cmd, EngineConfig* engine);

}  // namespace llm::cli
