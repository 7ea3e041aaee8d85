// Embedding (one block per token, generic bit extraction: not a hot path), elementwise add / clamp, the KV-cache
// store, and argmax (many blocks per row and a last-block reduction, ties to the lower index).
#include <algorithm>

#include "backend/cuda/misc.cuh"

namespace moecel::cuda {
namespace {

constexpr int kThreads = 256;

// Preconditions: one block per token; quantized tables have in % group_size == 0 and whole words per row.
__global__ void __launch_bounds__(kThreads)
    embedding_kernel(WeightView w, const int32_t* ids, float* out, unsigned* err) {
  pdl_enter();
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
  // kPer values per thread per round, every load of a round issued before its first store: the row is a random one
  // (DRAM), and a loop of store-then-load rounds cost one round trip per value (~5 us for a 2048-wide row).
  constexpr int kPer = 8;
  for (int64_t i0 = threadIdx.x; i0 < w.in; i0 += int64_t(kPer) * kThreads) {
    uint32_t lo[kPer], hi[kPer];
    float s[kPer], b[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = i0 + int64_t(j) * kThreads;
      lo[j] = hi[j] = 0u;
      s[j] = b[j] = 0.0f;
      if (i < w.in) {
        const int64_t bit = i * w.bits, wi = bit >> 5, g = id * groups + i / w.group_size;
        lo[j] = wr[wi];
        if (int(bit & 31) + w.bits > 32) hi[j] = wr[wi + 1];
        s[j] = load_float(w.scales, w.stype, g);
        if (w.biases) b[j] = load_float(w.biases, w.stype, g);
      }
    }
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = i0 + int64_t(j) * kThreads;
      if (i < w.in) {
        const int sh = int((i * w.bits) & 31);
        uint32_t q = lo[j] >> sh;
        if (sh + w.bits > 32) q |= hi[j] << (32 - sh);
        o[i] = __fadd_rn(__fmul_rn(s[j], float(q & mask)), b[j]);  // no fma: matches MLX / the CPU bit for bit
      }
    }
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* out) {
  pdl_enter();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = a[i] + b[i];
}

__global__ void clamp_kernel(float* x, int64_t n, float limit) {
  pdl_enter();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    x[i] = v < -limit ? -limit : (limit < v ? limit : v);  // std::clamp(v, -limit, limit)
  }
}

// Argmax of each row in two stages in one launch: grid (blocks, n_rows); block b of row r reduces the elements
// b * 1024 + threadIdx.x + j * gridDim.x * 1024 (increasing, so a strict > keeps the lowest index), writes its
// (value, index) to the partials, and the block that finishes last reduces every row's partials in block order
// (ties to the lower index), writes the ids and resets the counter. One block per row would leave the GPU idle.
constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxMaxBlocks = 64;

__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* logits, int64_t vocab, float* part_v, int* part_i, unsigned* counter, int32_t* out,
                  int64_t* advance, int32_t* host_out) {
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ bool last;
  pdl_enter();
  const int64_t row = blockIdx.y;
  const float* l = logits + row * vocab;
  float bv = 0.0f;
  int bi = -1;
  const int64_t stride = int64_t(gridDim.x) * kArgmaxThreads;
  for (int64_t i = int64_t(blockIdx.x) * kArgmaxThreads + threadIdx.x; i < vocab; i += stride) {
    const float v = l[i];
    if (bi < 0 || v > bv) {
      bv = v;
      bi = int(i);
    }
  }
  block_argmax(bv, bi, red_v, red_i);
  if (threadIdx.x == 0) {
    part_v[row * gridDim.x + blockIdx.x] = bv;
    part_i[row * gridDim.x + blockIdx.x] = bi;
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x * gridDim.y - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int64_t r = 0; r < gridDim.y; ++r) {
    float v;
    int i;
    block_argmax_partials(part_v + r * gridDim.x, part_i + r * gridDim.x, int(gridDim.x), red_v, red_i, v, i);
    const bool last_row = r + 1 == gridDim.y;  // advance and host_out are given for the last rows only
    if (threadIdx.x == 0) publish_argmax(i, out + r, last_row ? advance : nullptr, host_out);
  }
  if (threadIdx.x == 0) *counter = 0u;
}

// Grid-stride copy of n_tokens * width floats of k and v into the caches at row pos0 (or *step_pos).
__global__ void __launch_bounds__(kThreads)
    kv_store_kernel(const float* k, const float* v, int64_t n_tokens, int64_t width, int64_t pos0,
                    const int64_t* step_pos, int64_t capacity, float* kc, float* vc) {
  if (step_pos) pos0 = *step_pos;  // written before the graph's replay, never by a kernel: read before the wait
  pdl_enter();
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
  launch_k(ctx, embedding_kernel, unsigned(n_tokens), kThreads, 0, table, ids, out, ctx.error_flag);
}

void launch_add(const Ctx& ctx, const float* a, const float* b, int64_t n, float* out) {
  if (n == 0) return;
  launch_k(ctx, add_kernel, elementwise_blocks(ctx, n), kThreads, 0, a, b, n, out);
}

void launch_clamp(const Ctx& ctx, float* x, int64_t n, float limit) {
  if (n == 0) return;
  launch_k(ctx, clamp_kernel, elementwise_blocks(ctx, n), kThreads, 0, x, n, limit);
}

void launch_kv_store(const Ctx& ctx, const float* k, const float* v, int64_t n_tokens, int64_t width, int64_t pos0,
                     int64_t capacity, float* k_cache, float* v_cache) {
  if (n_tokens == 0 || width == 0) return;
  launch_k(ctx, kv_store_kernel, elementwise_blocks(ctx, n_tokens * width), kThreads, 0, k, v, n_tokens, width, pos0,
           ctx.step_pos, capacity, k_cache, v_cache);
}

size_t argmax_scratch_bytes(int64_t n_rows) {
  return size_t(n_rows) * kArgmaxMaxBlocks * (sizeof(float) + sizeof(int));
}

void launch_argmax(const Ctx& ctx, const float* logits, int64_t n_rows, int64_t vocab, int32_t* out, void* scratch,
                   int64_t* advance, int32_t* host_out) {
  if (n_rows == 0) return;
  CUDA_REQUIRE(vocab >= 1 && vocab < (int64_t(1) << 31), "argmax: vocab must be in [1, 2^31)");
  const int64_t blocks = std::min<int64_t>(kArgmaxMaxBlocks, (vocab + kArgmaxThreads - 1) / kArgmaxThreads);
  float* part_v = static_cast<float*>(scratch);
  int* part_i = reinterpret_cast<int*>(part_v + n_rows * kArgmaxMaxBlocks);
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t r0 = 0; r0 < n_rows; r0 += kMaxGridY) {
    const int64_t rows = std::min(kMaxGridY, n_rows - r0);
    launch_k(ctx, argmax_kernel, dim3(unsigned(blocks), unsigned(rows)), kArgmaxThreads, 0, logits + r0 * vocab, vocab,
             part_v, part_i, ctx.block_counter, out + r0, r0 + rows == n_rows ? advance : nullptr,
             n_rows == 1 && advance ? host_out : nullptr);
  }
}

}  // namespace moecel::cuda
