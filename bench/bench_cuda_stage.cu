// What staging a freshly written vector costs a decode kernel: a chain of PDL kernels in a CUDA graph, each block
// of each step loading the whole vector the step before wrote (as kernels A/B and the projections stage x or act),
// a block-wide sum of squares, then its slice of the next vector. Varied: the vector's size, the blocks per step,
// and the number of replicas the writer stores (block b reads replica b % R), which spreads the readers over more
// L2 lines; "clean" reads a vector written once before the chain instead (the same loads, no fresh lines).
// Prints microseconds per step. Built only with the CUDA backend.
// Usage: bench_cuda_stage [--steps N] [--reps N]
#include <cuda_runtime.h>

#include <cstdio>

#include "cuda_bench_util.cuh"

namespace {

constexpr int kThreads = 256, kMaxFloats = 8192;

// x: replicas of n floats, `stride` floats apart; reads replica blockIdx.x % r_read, writes all r_write of y.
__global__ void __launch_bounds__(kThreads)
    stage_kernel(const float* x, float* y, int n, int r_read, int r_write, int64_t stride) {
  __shared__ float4 xs[kMaxFloats / 4];
  __shared__ float red[kThreads / 32];
  moecel::cuda::pdl_wait();
  moecel::cuda::pdl_trigger();
  const float4* src = reinterpret_cast<const float4*>(x + (blockIdx.x % r_read) * stride);
  float s = 0.0f;
  for (int i = threadIdx.x; i < n / 4; i += kThreads) {
    const float4 v = __ldcg(src + i);
    xs[i] = v;
    s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  float total = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) total += red[i];
  const float inv = rsqrtf(total / n + 1e-5f);
  const float* xf = reinterpret_cast<const float*>(xs);
  const int per = (n + gridDim.x - 1) / gridDim.x;
  for (int i = threadIdx.x; i < per * r_write; i += kThreads) {
    const int rep = i / per, j = blockIdx.x * per + i % per;
    if (j < n) y[rep * stride + j] = xf[j] * inv;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = moecel::bench::arg_int(argc, argv, "--steps", 128);
  const int reps = moecel::bench::arg_int(argc, argv, "--reps", 50);
  constexpr int kMaxReplicas = 16;
  const int64_t stride = kMaxFloats + 64;  // floats between replicas (not a power of two apart)
  float *a, *b, *c;
  CUDA_CHECK(cudaMalloc(&a, stride * kMaxReplicas * 4));
  CUDA_CHECK(cudaMalloc(&b, stride * kMaxReplicas * 4));
  CUDA_CHECK(cudaMalloc(&c, stride * kMaxReplicas * 4));
  CUDA_CHECK(cudaMemset(a, 0, stride * kMaxReplicas * 4));
  CUDA_CHECK(cudaMemset(b, 0, stride * kMaxReplicas * 4));
  CUDA_CHECK(cudaMemset(c, 0, stride * kMaxReplicas * 4));
  cudaStream_t st;
  CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  int sms = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("%d SMs, %d threads per block, %d steps per graph, %d replays\n", sms, kThreads, steps, reps);
  std::printf("%-6s %7s %7s %8s %12s\n", "mode", "floats", "blocks", "replicas", "us_per_step");
  auto run = [&](bool clean, int n, int blocks, int r) {
    const double us = moecel::bench::chain_step_us(
        st, steps, reps, dim3(blocks), kThreads, true, a, b,
        [&](const cudaLaunchConfig_t& cfg, int, const float* x, float* y) {
          CUDA_CHECK(cudaLaunchKernelEx(&cfg, stage_kernel, clean ? c : x, y, n, r, clean ? 1 : r, stride));
        });
    std::printf("%-6s %7d %7d %8d %12.3f\n", clean ? "clean" : "fresh", n, blocks, r, us);
  };
  for (const int n : {2048, 8192}) {
    for (const int blocks : {sms, 2 * sms, 4 * sms}) {
      run(true, n, blocks, 1);
      run(true, n, blocks, 16);
      for (const int r : {1, 2, 4, 8, 16}) run(false, n, blocks, r);
    }
  }
  return 0;
}
