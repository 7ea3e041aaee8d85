// Embedding (one block per token, generic bit extraction: not a hot path), elementwise add / clamp, and
// argmax (one block per row, block reduction with ties to the lower index).
#include <algorithm>

#include "backend/cuda/misc.cuh"

namespace moecel::cuda {
namespace {

constexpr int kThreads = 256;

// Preconditions: one block per token; quantized tables have in % group_size == 0 and whole words per row.
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(WeightView w, const int32_t* ids, float* out, unsigned* err) {
  const int64_t t = blockIdx.x;
  const int64_t id = ids[t];
  float* o = out + t * w.in;
  if (id < 0 || id >= w.out) {
    if (threadIdx.x == 0) raise_device_error(err, kErrTokenId);
    for (int64_t i = threadIdx.x; i < w.in; i += kThreads) o[i] = __int_as_float(0x7fc00000);
    return;
  }
  if (w.bits == 0) {
    for (int64_t i = threadIdx.x; i < w.in; i += kThreads) o[i] = load_float(w.w, w.wtype, id * w.in + i);
    return;
  }
  const int64_t words = w.in * w.bits / 32, groups = w.in / w.group_size;
  const uint32_t* wr = static_cast<const uint32_t*>(w.w) + id * words;
  const uint32_t mask = (1u << w.bits) - 1u;
  for (int64_t i = threadIdx.x; i < w.in; i += kThreads) {
    const int64_t bit = i * w.bits, wi = bit >> 5;
    const int sh = int(bit & 31);
    uint32_t q = wr[wi] >> sh;
    if (sh + w.bits > 32) q |= wr[wi + 1] << (32 - sh);
    const int64_t g = id * groups + i / w.group_size;
    const float s = load_float(w.scales, w.stype, g);
    const float b = w.biases ? load_float(w.biases, w.stype, g) : 0.0f;
    o[i] = __fadd_rn(__fmul_rn(s, float(q & mask)), b);  // no fma: matches MLX / the CPU bit for bit
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void clamp_kernel(float* x, int64_t n, float limit) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    x[i] = v < -limit ? -limit : (limit < v ? limit : v);  // std::clamp(v, -limit, limit)
  }
}

// Preconditions: one block per row; blockDim.x == 1024.
__global__ void __launch_bounds__(1024) argmax_kernel(const float* logits, int64_t vocab, int32_t* out) {
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  const float* l = logits + int64_t(blockIdx.x) * vocab;
  float bv = 0.0f;
  int bi = -1;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {  // increasing i: a strict > keeps the lowest index
    const float v = l[i];
    if (bi < 0 || v > bv) {
      bv = v;
      bi = int(i);
    }
  }
  block_argmax(bv, bi, red_v, red_i);
  if (threadIdx.x == 0) out[blockIdx.x] = bi < 0 ? 0 : bi;
}

// Grid-stride copy of n_tokens * width floats of k and v into the caches at row pos0 (or *step_pos).
__global__ void __launch_bounds__(kThreads)
    kv_store_kernel(const float* k, const float* v, int64_t n_tokens, int64_t width, int64_t pos0,
                    const int64_t* step_pos, int64_t capacity, float* kc, float* vc) {
  if (step_pos) pos0 = *step_pos;
  const int64_t rows = min(n_tokens, capacity - pos0);
  if (pos0 < 0 || rows <= 0) return;
  const int64_t n = rows * width;
  float* kd = kc + pos0 * width;
  float* vd = vc + pos0 * width;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    kd[i] = k[i];
    vd[i] = v[i];
  }
}

unsigned elementwise_blocks(const Ctx& ctx, int64_t n) {
  const int64_t want = (n + kThreads - 1) / kThreads;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(std::max(ctx.sm_count, 1)) * 32)));
}

}  // namespace

void launch_embedding(const Ctx& ctx, const WeightView& table, const int32_t* ids, int64_t n_tokens, float* out) {
  if (n_tokens == 0 || table.in == 0) return;
  CUDA_REQUIRE(n_tokens < (int64_t(1) << 31), "embedding: too many tokens");
  CUDA_REQUIRE(table.bits == 0 ||
                   (table.group_size > 0 && table.in % table.group_size == 0 && (table.in * table.bits) % 32 == 0),
               "embedding: quantized table rows must be whole groups and words");
  embedding_kernel<<<unsigned(n_tokens), kThreads, 0, ctx.stream>>>(table, ids, out, ctx.error_flag);
  CUDA_CHECK_LAUNCH();
}

void launch_add(const Ctx& ctx, const float* a, const float* b, int64_t n, float* out) {
  if (n == 0) return;
  add_kernel<<<elementwise_blocks(ctx, n), kThreads, 0, ctx.stream>>>(a, b, n, out);
  CUDA_CHECK_LAUNCH();
}

void launch_clamp(const Ctx& ctx, float* x, int64_t n, float limit) {
  if (n == 0) return;
  clamp_kernel<<<elementwise_blocks(ctx, n), kThreads, 0, ctx.stream>>>(x, n, limit);
  CUDA_CHECK_LAUNCH();
}

void launch_kv_store(const Ctx& ctx, const float* k, const float* v, int64_t n_tokens, int64_t width, int64_t pos0,
                     int64_t capacity, float* k_cache, float* v_cache) {
  if (n_tokens == 0 || width == 0) return;
  kv_store_kernel<<<elementwise_blocks(ctx, n_tokens * width), kThreads, 0, ctx.stream>>>(
      k, v, n_tokens, width, pos0, ctx.step_pos, capacity, k_cache, v_cache);
  CUDA_CHECK_LAUNCH();
}

void launch_argmax(const Ctx& ctx, const float* logits, int64_t n_rows, int64_t vocab, int32_t* out) {
  if (n_rows == 0) return;
  CUDA_REQUIRE(vocab >= 1 && vocab < (int64_t(1) << 31), "argmax: vocab must be in [1, 2^31)");
  CUDA_REQUIRE(n_rows < (int64_t(1) << 31), "argmax: too many rows");
  argmax_kernel<<<unsigned(n_rows), 1024, 0, ctx.stream>>>(logits, vocab, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moecel::cuda
