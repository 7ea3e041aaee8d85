// Helpers of the CUDA calibration benches (bench_cuda_*.cu): timing a captured graph's replays, integer flags.
#pragma once
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_common.cuh"

namespace moecel::bench {

// Microseconds per call of launch() (which enqueues work on st): called once (warm-up), then `reps` times between
// two events.
template <class Launch>
double launches_us(cudaStream_t st, int reps, Launch launch) {
  launch();
  CUDA_CHECK(cudaStreamSynchronize(st));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  CUDA_CHECK(cudaEventRecord(e0, st));
  for (int i = 0; i < reps; ++i) launch();
  CUDA_CHECK(cudaEventRecord(e1, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
  CUDA_CHECK(cudaGetLastError());
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  return ms * 1000.0 / reps;
}

// Microseconds per replay of g (launches_us). Destroys g.
inline double graph_replay_us(cudaStream_t st, cudaGraph_t g, int reps) {
  cudaGraphExec_t ge;
  CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  const double us = launches_us(st, reps, [&] { CUDA_CHECK(cudaGraphLaunch(ge, st)); });
  CUDA_CHECK(cudaGraphExecDestroy(ge));
  CUDA_CHECK(cudaGraphDestroy(g));
  return us;
}

// Microseconds per step of a chain of `steps` launches captured into one graph and replayed `reps` times:
// launch(cfg, s, x, y) launches step s with cfg (grid x threads, smem bytes of dynamic shared memory, PDL when pdl),
// reading x and writing y (a and b in turn).
template <class Launch>
double chain_step_us(cudaStream_t st, int steps, int reps, dim3 grid, int threads, bool pdl, float* a, float* b,
                     Launch launch, size_t smem = 0) {
  cudaGraph_t g;
  CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  cuda::Ctx ctx;
  ctx.stream = st;
  ctx.pdl = pdl;
  for (int s = 0; s < steps; ++s) {
    cudaLaunchAttribute attr;
    const cudaLaunchConfig_t cfg = cuda::launch_config(ctx, grid, dim3(threads), smem, attr);
    launch(cfg, s, static_cast<const float*>((s & 1) ? b : a), (s & 1) ? a : b);
  }
  CUDA_CHECK(cudaStreamEndCapture(st, &g));
  return graph_replay_us(st, g, reps) / steps;
}

// The integer after flag `name` in argv, or def.
inline int arg_int(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return def;
}

}  // namespace moecel::bench
