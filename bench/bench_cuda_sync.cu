// What one dependent step of a decode chain costs on the GPU: a chain of N steps, each reading the vector the
// step before wrote (2,048 floats: a block-wide sum of squares, then a slice of the next vector), run as
//   pdl      N kernels in a CUDA graph with programmatic dependent launch (the decode step's way today),
//   plain    N kernels in a CUDA graph without it,
//   barrier  one persistent kernel (one block per SM) with a grid barrier between steps.
// Optionally each step also streams `--weight-kb` KB of stand-in weights (independent of the chain, like a
// projection's weights): loaded before pdl_wait in the kernels, before the previous step's barrier in the
// persistent kernel. Prints microseconds per step. Built only with the CUDA backend.
// Usage: bench_cuda_sync [--steps N] [--reps N] [--weight-kb KB]
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"

namespace {

constexpr int kH = 2048, kThreads = 256, kMaxWpt = 8;

// Per-thread stand-in weights of one step: `wpt` 16-byte loads, coalesced across the grid.
__device__ __forceinline__ void load_weights(const uint4* w, int64_t step_stride, int step, int wpt,
                                             uint4 (&r)[kMaxWpt]) {
  const int64_t gtid = int64_t(blockIdx.x) * kThreads + threadIdx.x, stride = int64_t(gridDim.x) * kThreads;
#pragma unroll
  for (int i = 0; i < kMaxWpt; ++i) {
    if (i < wpt) r[i] = __ldg(w + step * step_stride + i * stride + gtid);
  }
}

// One step: y = x * rsqrt(mean(x^2) + eps), each block writing its slice; the weights fold in as a no-op term.
__device__ __forceinline__ void step_body(const float* x, float* y, int wpt, const uint4 (&r)[kMaxWpt]) {
  __shared__ float red[kThreads / 32];
  float s = 0.0f;
  for (int i = threadIdx.x; i < kH; i += kThreads) s += x[i] * x[i];
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) total += red[i];
  __syncthreads();
  unsigned acc = 0;
#pragma unroll
  for (int i = 0; i < kMaxWpt; ++i) {
    if (i < wpt) acc ^= r[i].x ^ r[i].y ^ r[i].z ^ r[i].w;
  }
  const float inv = rsqrtf(total / kH + 1e-5f) + (acc == 0x9e3779b9u ? 1.0f : 0.0f);
  const int per = (kH + gridDim.x - 1) / gridDim.x;
  for (int i = threadIdx.x; i < per; i += kThreads) {
    const int j = blockIdx.x * per + i;
    if (j < kH) y[j] = x[j] * inv;
  }
}

__global__ void step_kernel(const float* x, float* y, const uint4* w, int64_t step_stride, int step, int wpt) {
  uint4 r[kMaxWpt];
  load_weights(w, step_stride, step, wpt, r);
  moecel::cuda::pdl_wait();
  moecel::cuda::pdl_trigger();
  step_body(x, y, wpt, r);
}

// Grid barrier on a counter that only grows: the n-th barrier releases once n * gridDim.x blocks arrived.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned target) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(counter, 1u);
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
  }
  __syncthreads();
}

__global__ void chain_kernel(float* a, float* b, const uint4* w, int64_t step_stride, int steps, int wpt,
                             unsigned* counter, unsigned base) {
  uint4 r[kMaxWpt];
  load_weights(w, step_stride, 0, wpt, r);
  for (int s = 0; s < steps; ++s) {
    const float* x = (s & 1) ? b : a;
    float* y = (s & 1) ? a : b;
    step_body(x, y, wpt, r);
    if (s + 1 < steps) load_weights(w, step_stride, s + 1, wpt, r);  // in flight during the barrier
    grid_barrier(counter, base + unsigned(s + 1) * gridDim.x);
  }
}

// Instruction-fetch experiment: kernels of ~N FFMAs each, either unrolled (N instructions of code, executed once)
// or as a loop over a 64-instruction body (the same work from ~1 KB of code). ID makes each kernel's code distinct,
// so a chain cycling through four of them never finds the next one's code in the instruction cache it just used.
template <int ID, int N, bool UNROLL>
__global__ void code_kernel(const float* x, float* y) {
  moecel::cuda::pdl_wait();
  moecel::cuda::pdl_trigger();
  float v0 = x[threadIdx.x], v1 = v0 + 1.0f, v2 = v0 + 2.0f, v3 = v0 + 3.0f;
  constexpr float c = 1.0f + ID * 1e-3f;
  if constexpr (UNROLL) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      v0 = fmaf(v0, c, float(i) * 1e-7f);
      v1 = fmaf(v1, c, float(i) * 2e-7f);
      v2 = fmaf(v2, c, float(i) * 3e-7f);
      v3 = fmaf(v3, c, float(i) * 4e-7f);
    }
  } else {
#pragma unroll 1
    for (int j = 0; j < N / 64; ++j) {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        v0 = fmaf(v0, c, float(i) * 1e-7f);
        v1 = fmaf(v1, c, float(i) * 2e-7f);
        v2 = fmaf(v2, c, float(i) * 3e-7f);
        v3 = fmaf(v3, c, float(i) * 4e-7f);
      }
    }
  }
  if (blockIdx.x == 0) y[threadIdx.x] = (v0 + v1) + (v2 + v3);
}

// Microseconds per step of a graph of `steps` kernels cycling through code_kernel<0..3, N, UNROLL>.
template <int N, bool UNROLL>
double code_chain(cudaStream_t st, int sms, int steps, int reps, float* a, float* b) {
  void (*ks[4])(const float*, float*) = {code_kernel<0, N, UNROLL>, code_kernel<1, N, UNROLL>,
                                         code_kernel<2, N, UNROLL>, code_kernel<3, N, UNROLL>};
  return moecel::bench::chain_step_us(st, steps, reps, dim3(sms), kThreads, true, a, b,
                                      [&](const cudaLaunchConfig_t& cfg, int s, const float* x, float* y) {
                                        CUDA_CHECK(cudaLaunchKernelEx(&cfg, ks[s % 4], x, y));
                                      });
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = moecel::bench::arg_int(argc, argv, "--steps", 128);
  const int reps = moecel::bench::arg_int(argc, argv, "--reps", 50);
  const int weight_kb = moecel::bench::arg_int(argc, argv, "--weight-kb", 0);
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t grid_threads = int64_t(sms) * kThreads;
  const int wpt = std::min(kMaxWpt, int((int64_t(weight_kb) * 1024 / 16 + grid_threads - 1) / grid_threads));
  const int64_t step_stride = int64_t(kMaxWpt) * grid_threads;  // uint4s per step's weights
  float *a, *b;
  uint4* w;
  unsigned* counter;
  CUDA_CHECK(cudaMalloc(&a, kH * 4));
  CUDA_CHECK(cudaMalloc(&b, kH * 4));
  CUDA_CHECK(cudaMalloc(&w, size_t(step_stride) * steps * 16));
  CUDA_CHECK(cudaMalloc(&counter, 4));
  CUDA_CHECK(cudaMemset(w, 0x11, size_t(step_stride) * steps * 16));
  CUDA_CHECK(cudaMemset(counter, 0, 4));
  std::vector<float> ones(kH, 1.0f);
  CUDA_CHECK(cudaMemcpy(a, ones.data(), kH * 4, cudaMemcpyHostToDevice));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::printf("%d SMs, %d threads per block, %d steps, %d x 16 B of weights per thread per step (%.0f KB)\n", sms,
              kThreads, steps, wpt, double(wpt) * grid_threads * 16 / 1024);

  unsigned barriers = 0;  // the counter's value after every persistent launch so far
  for (const std::string mode : {"pdl", "plain", "barrier"}) {
    double us = 0;  // per step
    if (mode == "barrier") {
      // Each replay adds steps * sms to the counter: the base is passed per launch below, so the persistent kernel
      // is launched directly instead of from a graph (one launch holds the whole chain either way).
      auto launch = [&] {
        chain_kernel<<<sms, kThreads, 0, st>>>(a, b, w, step_stride, steps, wpt, counter, barriers);
        barriers += unsigned(steps) * unsigned(sms);
      };
      us = moecel::bench::launches_us(st, reps, launch) / steps;
    } else {
      us = moecel::bench::chain_step_us(
          st, steps, reps, dim3(sms), kThreads, mode == "pdl", a, b,
          [&](const cudaLaunchConfig_t& cfg, int s, const float* x, float* y) {
            CUDA_CHECK(cudaLaunchKernelEx(&cfg, step_kernel, x, y, static_cast<const uint4*>(w), step_stride, s, wpt));
          });
    }
    float check = 0;
    CUDA_CHECK(cudaMemcpy(&check, a, 4, cudaMemcpyDeviceToHost));
    std::printf("%-8s %8.3f us per step (x[0] = %g)\n", mode.c_str(), us, check);
  }
  std::printf("instruction fetch: 4 kernels in turn, ~N FFMA each, unrolled (N instructions) vs looped (~64)\n");
  std::printf("N=256   unrolled %7.3f  looped %7.3f us per step\n", code_chain<256, true>(st, sms, steps, reps, a, b),
              code_chain<256, false>(st, sms, steps, reps, a, b));
  std::printf("N=1024  unrolled %7.3f  looped %7.3f us per step\n", code_chain<1024, true>(st, sms, steps, reps, a, b),
              code_chain<1024, false>(st, sms, steps, reps, a, b));
  std::printf("N=4096  unrolled %7.3f  looped %7.3f us per step\n", code_chain<4096, true>(st, sms, steps, reps, a, b),
              code_chain<4096, false>(st, sms, steps, reps, a, b));
  return 0;
}
