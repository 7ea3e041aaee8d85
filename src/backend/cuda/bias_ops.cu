// Bias add and sigmoid-gated add: grid-stride elementwise kernels (memory bound, one pass each).
#include <algorithm>

#include "backend/cuda/bias_ops.cuh"

namespace moecel::cuda {
namespace {

constexpr int kThreads = 256;

// Preconditions: grid-stride over n_rows * d elements; d > 0.
__global__ void add_bias_kernel(float* x, int64_t n, int64_t d, const void* bias, FloatType bias_type) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    x[i] += load_float(bias, bias_type, i % d);
  }
}

// Preconditions: grid-stride over n_rows * d elements; d > 0.
__global__ void add_sigmoid_gated_kernel(const float* a, const float* gate, const float* b, int64_t n, int64_t d,
                                         float* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float s = 1.0f / (1.0f + expf(-gate[i / d]));
    out[i] = a[i] + s * b[i];
  }
}

unsigned blocks_for(const Ctx& ctx, int64_t n) {
  const int64_t want = (n + kThreads - 1) / kThreads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(std::max(ctx.sm_count, 1)) * 32)));
}

}  // namespace

void launch_add_bias(const Ctx& ctx, float* x, int64_t n_rows, int64_t d, const void* bias, FloatType bias_type) {
  CUDA_REQUIRE(d > 0 && n_rows >= 0, "add_bias: bad shape");
  const int64_t n = n_rows * d;
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(x, n, d, bias, bias_type);
  CUDA_CHECK_LAUNCH();
}

void launch_add_sigmoid_gated(const Ctx& ctx, const float* a, const float* gate, const float* b, int64_t n_rows,
                              int64_t d, float* out) {
  CUDA_REQUIRE(d > 0 && n_rows >= 0, "add_sigmoid_gated: bad shape");
  const int64_t n = n_rows * d;
  if (n == 0) return;
  add_sigmoid_gated_kernel<<<blocks_for(ctx, n), kThreads, 0, ctx.stream>>>(a, gate, b, n, d, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moecel::cuda
