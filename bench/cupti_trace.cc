// A kernel timeline for any CUDA program, without nsys (the GPU machine has none): a CUPTI
// injection library. CUDA loads it at initialisation when CUDA_INJECTION64_PATH names it (the
// mechanism Nsight Systems uses); it records every kernel, graph-launched ones included, with
// CUPTI's concurrent-kernel activity (which does not serialise kernels, so programmatic
// dependent launch still overlaps them), and writes one CSV line per kernel at exit:
//
//   export CUDA_INJECTION64_PATH=$PWD/build/libllm_cupti_trace.so LLM_TRACE_OUT=/tmp/trace.csv
//   build/llm bench --device cuda --load-format dummy ...
//   python3 bench/kernel_timeline.py /tmp/trace.csv       # where a decode step's time goes
//
// Columns: start_ns, end_ns (GPU timestamps), graph_id (0: not from a graph), stream, grid,
// block, dynamic shared memory, registers... (see kHeader), the mangled kernel name.
// Records are kept in host memory until exit (~200 bytes per kernel: a 256-token batch-1 run
// of Llama-2-7B launches ~60k kernels). LLM_TRACE_MAX (default 2,000,000) caps them.
#include <cupti.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;
constexpr const char* kHeader =
    "start_ns,end_ns,graph_id,graph_node_id,stream,grid_x,grid_y,grid_z,block_x,"
    "dynamic_smem,registers,name";

struct Kernel {
  uint64_t start, end, graph_node;
  uint32_t graph, stream;
  int32_t grid[3], block;
  int32_t dynamic_smem;
  uint16_t registers;
  std::string name;
};

std::mutex mu;
std::vector<Kernel> kernels;
size_t max_kernels = 2'000'000;
uint64_t dropped = 0;

void Check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "[cupti_trace] %s: %s\n", what, msg ? msg : "?");
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mu);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      continue;
    }
    if (kernels.size() >= max_kernels) {
      ++dropped;
      continue;
    }
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    kernels.push_back(Kernel{k->start,
                             k->end,
                             k->graphNodeId,
                             k->graphId,
                             k->streamId,
                             {k->gridX, k->gridY, k->gridZ},
                             k->blockX,
                             k->dynamicSharedMemory,
                             k->registersPerThread,
                             k->name ? k->name : "?"});
  }
  size_t n = 0;
  Check(cuptiActivityGetNumDroppedRecords(nullptr, 0, &n), "dropped records");
  dropped += n;
  std::free(buffer);
}

void WriteTrace() {
  Check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flush");
  const char* path = std::getenv("LLM_TRACE_OUT");
  const std::string out = path ? path : "cupti_trace.csv";
  std::lock_guard<std::mutex> lock(mu);
  std::FILE* f = std::fopen(out.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "[cupti_trace] cannot write %s\n", out.c_str());
    return;
  }
  std::fprintf(f, "%s\n", kHeader);
  for (const Kernel& k : kernels) {
    std::fprintf(f, "%llu,%llu,%u,%llu,%u,%d,%d,%d,%d,%d,%u,%s\n",
                 static_cast<unsigned long long>(k.start), static_cast<unsigned long long>(k.end),
                 k.graph, static_cast<unsigned long long>(k.graph_node), k.stream, k.grid[0],
                 k.grid[1], k.grid[2], k.block, k.dynamic_smem, unsigned(k.registers),
                 k.name.c_str());
  }
  std::fclose(f);
  std::fprintf(stderr, "[cupti_trace] %zu kernels -> %s (%llu dropped)\n", kernels.size(),
               out.c_str(), static_cast<unsigned long long>(dropped));
}

}  // namespace

// Called by the CUDA driver when CUDA_INJECTION64_PATH names this library.
extern "C" int InitializeInjection(void) {
  if (const char* m = std::getenv("LLM_TRACE_MAX")) max_kernels = std::strtoull(m, nullptr, 10);
  Check(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted), "register callbacks");
  Check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable kernel activity");
  std::atexit(WriteTrace);
  return 1;
}
