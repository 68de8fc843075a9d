#include "server/cli/backend.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/cpu/cpu_executor.h"
#include "engine/error.h"
#include "engine/testing/fault_injection.h"

#if defined(LLM_HAS_CUDA)
#include "engine/cuda/cuda_executor.h"
#endif

namespace llm::cli {

void AddKvReserveOptions(CLI::App* cmd, EngineConfig* engine) {
  cmd->add_option("--kv-reserve-ratio", engine->kv_reserve_ratio,
                  "admit a request only while the free KV blocks cover this share of the tokens "
                  "the running ones may still generate (up to 4,096 each), so that they are not "
                  "preempted; the share then follows what finished requests used of their "
                  "max_tokens, and rises after a preemption (0: admit whenever the prompt fits)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--kv-reserve-min-ratio", engine->kv_reserve_min_ratio,
                  "the least share the KV reserve goes to (at most --kv-reserve-ratio)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
}

void BackendFlags::AddTo(CLI::App* cmd) {
  cmd->add_option("--device", device, "cpu, cuda, or auto (cuda when a GPU is present)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--dtype", dtype,
                  "weights (and on cuda activations + KV cache): auto, f32 (cpu), bf16, f16")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16"}))
      ->capture_default_str();
  cmd->add_option("--load-format", load_format,
                  "auto: the checkpoint; dummy: random weights for the config (benchmarks)")
      ->check(CLI::IsMember({"auto", "dummy"}))
      ->capture_default_str();
  cmd->add_option("--gpu-memory-utilization", gpu_memory_utilization,
                  "fraction of GPU memory for weights, activations and the KV cache")
      ->check(CLI::Range(0.01, 1.0))
      ->capture_default_str();
  cmd->add_flag("--enforce-eager", enforce_eager, "cuda: no CUDA graphs");
  cmd->add_option("--gemv-max-tokens", gemv_max_tokens,
                  "cuda: steps of up to N tokens run their linear layers on our GEMV kernel "
                  "(0: cuBLASLt)")
      ->check(CLI::Range(0, 8))
      ->capture_default_str();
  cmd->add_option("--decode-min-tiles-per-split", decode_min_tiles_per_split,
                  "cuda: the decode attention splits a sequence's keys over CTAs (split-KV) "
                  "with at least this many 64-key tiles per split")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_flag("--packed-step-inputs,!--no-packed-step-inputs", packed_step_inputs,
                "cuda: send a step's inputs to the device in one packed copy and one scatter "
                "kernel (the default) instead of one copy per input array");
  cmd->add_flag("--async-masks,!--no-async-masks", async_masks,
                "cuda, structured outputs: launch a grammar step while the step before it runs "
                "and compute its masks on the host while its forward runs (the default) "
                "instead of waiting for the step before and computing them before the forward");
  cmd->add_flag("--fp8-prefill-wgmma,!--no-fp8-prefill-wgmma", fp8_prefill_wgmma,
                "cuda, --kv-cache-dtype fp8: prefill attention on the wgmma kernel over an "
                "exact bf16/fp16 copy of each step's prefill pages (the default; a scratch "
                "sized for one maximum-length sequence) instead of the mma.sync kernel that "
                "reads the e4m3 cache directly");
  cmd->add_flag("--gemm-autotune,!--no-gemm-autotune", gemm_autotune,
                "cuda, one GPU: at start-up, time cuBLASLt's candidate algorithms for every GEMM "
                "shape of the decode batch sizes with CUDA graphs and keep the fastest instead of "
                "the heuristic's first (~3 s more start-up; measured +0.2-0.3% end to end on the "
                "H200)");
  cmd->add_option("--moe-kernels", moe_kernels,
                  "cuda, mixture-of-experts models: v5 (the default: v4 with decode steps of 9 "
                  "or more tokens on the warpgroup MMAs too; H100, Qwen3-30B-A3B throughput "
                  "1.375x v4's in bf16, 1.088x in fp8), v4 (v3 with prefill-size steps' "
                  "expert GEMMs on Hopper warpgroup MMAs; H100, Qwen3-30B-A3B TTFT of 4,096 "
                  "tokens 0.48x v3's, throughput 1.035x), v3 (v2 with routing and grouping "
                  "in one kernel for steps of up to 64 tokens, tiles that skip the rows an "
                  "expert lacks, a GEMV streaming through a shared-memory ring that writes "
                  "SiLU(gate)*up itself; H100, Qwen3-30B-A3B batch-1 decode 1.02x v2's), v2 (one "
                  "grouping kernel; steps of up to 8 tokens on a GEMV over each chosen expert, "
                  "larger ones on 4-stage tiles; H200: batch-1 decode 1.71x and throughput 1.05x "
                  "v1's) or v1 (four grouping launches, every grouped GEMM on 2-stage tiles)")
      ->check(CLI::IsMember({"v1", "v2", "v3", "v4", "v5"}))
      ->capture_default_str();
  cmd->add_flag("--moe-combine-in-norm,!--no-moe-combine-in-norm", moe_combine_in_norm,
                "cuda, mixture-of-experts models, steps of up to 8 tokens on one GPU: the "
                "experts' weighted sum added to the residual by the next RMSNorm's kernel "
                "instead of by a kernel of its own (off by default: measured no faster on the "
                "H100)");
  cmd->add_flag("--gemv-fold-norm", gemv_fold_norm,
                "cuda, bf16, one GPU: on GEMV steps, fold the RMSNorms into the GEMVs around "
                "them (the residual projections write the next norm's input and sums of "
                "squares) instead of running them as kernels of their own (measured slower on "
                "the H200)");
  cmd->add_flag("--gemv-chain", gemv_chain,
                "cuda, bf16 activations, one GPU: on GEMV steps, run each dense layer's o, "
                "gate|up and down projections as one persistent kernel with grid barriers "
                "between them (implies --gemv-fold-norm; its first version measured slower on "
                "the H100)");
  cmd->add_flag("--gemv-balanced-grid", gemv_balanced_grid,
                "cuda: on GEMV steps, give every CTA of a persistent GEMV grid the same number "
                "of row groups (fewer CTAs where the groups do not fill two per slot; not yet "
                "measured)");
  cmd->add_flag("--decode-overlap", decode_overlap,
                "cuda, --quantization fp8, one GPU: run a decode step's rows as two halves on two "
                "streams half a layer apart, so that one half's attention (memory-bound) runs "
                "beside the other's GEMMs (compute-bound); steps of at least 64 sequences, "
                "dense layers (not yet measured)");
  cmd->add_option("--decode-overlap-gemm-sms", decode_overlap_gemm_sms,
                  "cuda, --decode-overlap: size the halves' GEMMs for this many SMs (cuBLASLt's "
                  "SM count target), leaving the others to the attention beside them; 0: all")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_flag("--rope-head-warps,!--no-rope-head-warps", rope_head_warps,
                "cuda, per-head q/k norms (Qwen3) at head_dim 64/128/256: RoPE and the KV "
                "append with one warp per head (the default; H100, Qwen3-30B-A3B batch-1 decode "
                "1.03x) or one CTA per token (--no-rope-head-warps)");
  cmd->add_flag("--gemv-ring,!--no-gemv-ring", gemv_ring,
                "cuda: on GEMV steps, stream the weights through a ring of shared-memory stages "
                "that bulk copies fill from the kernel's start (one CTA per SM), so that the "
                "next GEMV loads its first weights beside the RMSNorm or attention before it; "
                "the same bits as the register kernel (measured slower on the H100, fp8 "
                "weights 2x)");
  cmd->add_option("--gemv-ring-kib", gemv_ring_kib,
                  "cuda: the --gemv-ring kernel's ring of weight stages per CTA, in KiB")
      ->check(CLI::Range(1, 200))
      ->capture_default_str();
  cmd->add_flag("--gemv-norm-prologue", gemv_norm_prologue,
                "cuda: on GEMV steps, run the RMSNorm before q|k|v and gate|up in the GEMV's "
                "prologue instead of as its own kernel (measured slower on the H200)");
  cmd->add_flag("--disable-pdl", disable_pdl,
                "cuda: no programmatic dependent launch between kernels");
  cmd->add_flag("--decode-kv-before-wait,!--no-decode-kv-before-wait", decode_kv_before_wait,
                "cuda: the decode attention copies its first K/V tiles (all but the newest "
                "key's) under the tail of the kernel before it, before waiting for it (batch-1 "
                "decode 0.4-0.6% faster on an H100, the same tokens; the default)");
  cmd->add_flag("--fp8-precise-accum", fp8_precise_accum,
                "cuda, --quantization fp8: GEMMs promote their FP8 partial sums to fp32 "
                "periodically (cuBLASLt's default) instead of the tensor cores' fast "
                "accumulation that vLLM's and TensorRT-LLM's FP8 kernels use");
  // Two callbacks, not a negatable flag: CLI11 fills an optional<bool> flag with false when
  // neither spelling is given, and "not given" must mean "the device's default".
  cmd->add_flag_callback(
      "--async-scheduling", [this] { async_scheduling = true; },
      "schedule and prepare step N+1 while the model runs step N (same outputs; penalties and "
      "n > 1 forks still wait for the previous step); default: on for --device cuda, off on "
      "the cpu (where the host runs the model itself)");
  cmd->add_flag_callback(
      "--no-async-scheduling", [this] { async_scheduling = false; },
      "schedule step N+1 only after step N's results are processed");
  cmd->add_option("--dummy-seed", dummy_seed, "seed of --load-format dummy weights")
      ->capture_default_str();
  cmd->add_option("--tensor-parallel-size", tensor_parallel_size,
                  "cuda: split the model over GPUs 0..N-1 (Megatron-style, NCCL all-reduce); "
                  "N must divide the attention heads, KV heads and intermediate size")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", kv_cache_dtype,
                  "KV cache element type: auto (cpu: f32, cuda: the model's dtype) or fp8 / "
                  "fp8_e4m3 (e4m3, per-tensor scales of 1: half the bytes of bf16 on cuda, a "
                  "quarter of f32 on cpu)")
      ->check(CLI::IsMember({"auto", "fp8", "fp8_e4m3"}))
      ->capture_default_str();
  cmd->add_option("--quantization", quantization,
                  "none, fp8 or int8: the linear layers' weights quantized at load with one "
                  "scale per output row (a quarter of the bytes of f32, half of bf16; "
                  "embeddings and lm_head unchanged). fp8: e4m3 (cuda also quantizes the "
                  "activations per token and runs FP8 GEMMs). int8 (cpu): int8 codes multiplied "
                  "on integer dot products (AVX-512 VNNI / AVX2) against the activations "
                  "quantized per block of 32")
      ->check(CLI::IsMember({"none", "fp8", "int8"}))
      ->capture_default_str();
  cmd->add_flag("--disable-custom-all-reduce", disable_custom_all_reduce,
                "cuda, --tensor-parallel-size > 1: every all-reduce through NCCL (default: "
                "small steps take our one-shot kernel over peer access)");
}

LoadOptions CpuLoadOptions(const BackendFlags& f) {
  LoadOptions load;
  if (f.dtype == "f32") load.weight_dtype = DType::kF32;
  if (f.dtype == "bf16") load.weight_dtype = DType::kBF16;
  if (f.dtype == "f16") load.weight_dtype = DType::kF16;
  load.fp8_weights = f.quantization == "fp8";
  load.int8_weights = f.quantization == "int8";
  return load;
}

void CheckCpuFlags(const BackendFlags& f) {
  if (f.load_format == "dummy") throw Error("--load-format dummy needs --device cuda");
  if (f.fp8_precise_accum) {
    throw Error(
        "--fp8-precise-accum applies to --device cuda --quantization fp8 (the CPU's fp8 "
        "weights accumulate in fp32)");
  }
  if (f.tensor_parallel_size > 1) throw Error("--tensor-parallel-size needs --device cuda");
}

bool CudaDevicePresent() {
#if defined(LLM_HAS_CUDA)
  return CudaBackendAvailable();
#else
  return false;
#endif
}

namespace {

Backend MakeCpu(const std::string& model_path, const BackendFlags& f, EngineConfig* engine) {
  CheckCpuFlags(f);
  Backend b;
  b.cpu_model = CpuModel::Load(model_path, CpuLoadOptions(f));
  engine->kv_cache_dtype = ParseKvCacheDType(f.kv_cache_dtype);
  const int64_t blocks = KvCachePool::NumBlocksForBytes(
      b.cpu_model->config(), engine->block_size, engine->kv_cache_bytes, engine->kv_cache_dtype);
  b.executor = std::make_unique<CpuExecutor>(*b.cpu_model, blocks, engine->block_size,
                                             engine->kv_cache_dtype);
  b.device = "cpu";
  return b;
}

#if defined(LLM_HAS_CUDA)
Backend MakeCuda(const std::string& model_path, const BackendFlags& f, EngineConfig* engine) {
  if (f.dtype == "f32") throw Error("--device cuda runs bf16 or f16 (not f32)");
  if (f.quantization == "int8") {
    throw Error("--quantization int8 is the CPU's 8-bit path; on --device cuda use fp8");
  }
  CudaExecutorOptions o;
  o.fp8_weights = f.quantization == "fp8";
  if (f.fp8_precise_accum && !o.fp8_weights) {
    throw Error("--fp8-precise-accum needs --quantization fp8");
  }
  o.fp8_fast_accum = !f.fp8_precise_accum;
  o.dtype = f.dtype == "f16" ? DType::kF16 : DType::kBF16;
  o.kv_cache_fp8 = ParseKvCacheDType(f.kv_cache_dtype) == KvCacheDType::kFp8E4m3;
  o.block_size = engine->block_size;
  o.max_num_batched_tokens = engine->max_num_batched_tokens;
  o.max_num_seqs = engine->max_num_seqs;
  o.gpu_memory_utilization = f.gpu_memory_utilization;
  o.cuda_graphs = !f.enforce_eager;
  o.gemv_max_tokens = f.gemv_max_tokens;
  o.gemv_norm_prologue = f.gemv_norm_prologue;
  o.gemv_fold_norm = f.gemv_fold_norm;
  o.gemv_chain = f.gemv_chain;
  o.gemv_balanced_grid = f.gemv_balanced_grid;
  o.decode_overlap = f.decode_overlap;
  o.decode_overlap_gemm_sms = f.decode_overlap_gemm_sms;
  o.gemv_ring = f.gemv_ring;
  o.gemv_ring_kib = f.gemv_ring_kib;
  o.rope_head_warps = f.rope_head_warps;
  o.moe_kernels = f.moe_kernels[1] - '0';  // "v1" .. "v5" (checked by the option)
  o.moe_combine_in_norm = f.moe_combine_in_norm;
  o.decode_min_tiles_per_split = f.decode_min_tiles_per_split;
  o.packed_step_inputs = f.packed_step_inputs;
  o.async_masks = f.async_masks;
  o.fp8_prefill_wgmma = f.fp8_prefill_wgmma;
  o.gemm_autotune = f.gemm_autotune;
  o.programmatic_launch = !f.disable_pdl;
  o.decode_kv_before_wait = f.decode_kv_before_wait;
  o.dummy_weights = f.load_format == "dummy";
  o.dummy_seed = f.dummy_seed;
  o.tensor_parallel_size = f.tensor_parallel_size;
  o.custom_all_reduce = !f.disable_custom_all_reduce;
  Backend b;
  b.executor = CudaExecutor::Create(model_path, o);
  b.device = "cuda";
  engine->batch_invariant = false;
  return b;
}
#endif

// TEST-ONLY hook, for tests that run the real `llm` binary
// (tests/server/cli/serve_process_test.cc): LLM_TEST_FAIL_FORWARD_ON_TOKEN=<id> wraps the executor
// so that every step whose batch holds token <id> throws (as a step that ran out of memory would);
// LLM_TEST_FAIL_FORWARD_FATAL=1 makes those failures fatal (as a sticky CUDA error is). Unset,
// nothing changes.
void InjectTestFaults(Backend* b) {
  const char* token = std::getenv("LLM_TEST_FAIL_FORWARD_ON_TOKEN");
  if (token == nullptr || *token == '\0') return;
  char* end = nullptr;
  const long id = std::strtol(token, &end, 10);
  if (*end != '\0' || id < 0 || id >= b->executor->config().vocab_size) {
    throw Error("LLM_TEST_FAIL_FORWARD_ON_TOKEN must be a token id (got '" + std::string(token) +
                "')");
  }
  const char* fatal = std::getenv("LLM_TEST_FAIL_FORWARD_FATAL");
  FaultPlan plan;
  plan.fail_on_token = static_cast<int>(id);
  if (fatal != nullptr && std::string(fatal) == "1") plan.kind = FaultPlan::Kind::kFatal;
  std::fprintf(stderr, "[llm] TEST HOOK: every step holding token %ld fails%s\n", id,
               plan.kind == FaultPlan::Kind::kFatal ? " fatally" : "");
  b->executor = std::make_unique<FaultInjectingExecutor>(std::move(b->executor), plan);
}

Backend SelectBackend(const std::string& model_path, const BackendFlags& f, EngineConfig* engine) {
  std::string device = f.device;
  if (device == "auto") device = CudaDevicePresent() ? "cuda" : "cpu";
  if (device == "cpu") return MakeCpu(model_path, f, engine);
#if defined(LLM_HAS_CUDA)
  if (f.device == "auto") {
    try {
      return MakeCuda(model_path, f, engine);
    } catch (const Error& e) {
      // A model the GPU path cannot run (e.g. head_dim 32) still serves on the CPU.
      std::fprintf(stderr, "[llm] --device auto: cuda backend unavailable (%s); using the cpu\n",
                   e.what());
      return MakeCpu(model_path, f, engine);
    }
  }
  return MakeCuda(model_path, f, engine);
#else
  throw Error("--device cuda: this build has no CUDA backend (built without nvcc)");
#endif
}

}  // namespace

Backend MakeBackend(const std::string& model_path, const BackendFlags& f, EngineConfig* engine) {
  Backend b = SelectBackend(model_path, f, engine);
  engine->async_scheduling = f.async_scheduling.value_or(b.device == "cuda");
  InjectTestFaults(&b);
  return b;
}

}  // namespace llm::cli
