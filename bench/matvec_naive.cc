// The peer's decode matvec, for a same-run baseline: llama2.c's run.c `matmul` (OpenMP
// parallel-for over output rows, a plain dot product per row), compiled as its Makefile's
// `runomp` target compiles it (-Ofast: the float reduction vectorises).
#include <cstdint>

void NaiveMatvec(float* xout, const float* x, const float* w, int n, int d) {
  int i;
#pragma omp parallel for private(i)
  for (i = 0; i < d; i++) {
    float val = 0.0f;
    for (int j = 0; j < n; j++) val += w[static_cast<int64_t>(i) * n + j] * x[j];
    xout[i] = val;
  }
}
