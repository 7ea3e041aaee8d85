// Internal to the matrix-vector kernels (qgemv.cu: CUDA cores, any bits; qgemv_mma.cu: tensor cores, 4/8 bits):
// their launch arguments and the staging, fusion and epilogue steps they share.
#pragma once
#include <cstdint>

#include "backend/cuda/moe.cuh"
#include "backend/cuda/qdot.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda::gemv {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;

struct GemvArgs {
  WeightView w[kMaxGemvParts];  // part i: blocks [part_end[i - 1], part_end[i]) of grid.x, writing y[i]
  float* y[kMaxGemvParts];
  unsigned part_end[kMaxGemvParts];
  int n_parts = 1;
  const float* x;
  PairMap map;
  unsigned* err;
  GemvFusion f;         // the decode fusions (qmatmul.cuh); all off for a plain product
  int glu = -1;         // >= 0 (a GluAct): y[0] = act(part 0) * part 1, row by row (launch_gather_glu_gemv)
  int stages = 1;       // gemv_bulk_kernel: barriers a block's row copies are split over (1, 2, 4 or 8)
  int depth = 1;        // gemv_bulk_kernel: stages in flight at once
  int stage_shift = 3;  // gemv_bulk_kernel: log2 of the warps per stage (8 / stages)
};

// Part of the launch this block works on, without indexing the parameter arrays dynamically (which would copy
// them to local memory).
struct Part {
  WeightView w;
  float* y;
  int64_t block;  // block index within the part
};

__device__ __forceinline__ Part part_of_block(const GemvArgs& a, unsigned bx) {
  if (a.n_parts > 1 && bx >= a.part_end[0]) {
    if (a.n_parts > 2 && bx >= a.part_end[1]) return {a.w[2], a.y[2], int64_t(bx - a.part_end[1])};
    return {a.w[1], a.y[1], int64_t(bx - a.part_end[0])};
  }
  return {a.w[0], a.y[0], int64_t(bx)};
}

__device__ __forceinline__ Part block_part(const GemvArgs& a) {
  return part_of_block(a, blockIdx.x);
}

// Resolves pair p to its expert; an out-of-range index fills this block's rows of y with NaN and raises the
// error flag. Returns -1 then (uniform over the block, so the caller may return before any barrier).
__device__ __forceinline__ int64_t pair_expert(const GemvArgs& a, const Part& pt, int64_t p, int rpw) {
  if (!a.map.indices) return 0;
  const int64_t e = a.map.indices[p];
  if (e >= 0 && e < pt.w.n_stack) return e;
  if (threadIdx.x == 0) raise_device_error(a.err, kErrExpertIndex);
  const int64_t row0 = (pt.block * kWarps + (threadIdx.x >> 5)) * rpw;
  if ((threadIdx.x & 31) == 0) {
    for (int64_t row = row0; row < row0 + rpw && row < pt.w.out; ++row)
      pt.y[p * pt.w.out + row] = __int_as_float(0x7fc00000);
  }
  return -1;
}

__device__ __forceinline__ const float* pair_x(const GemvArgs& a, int64_t in, int64_t p) {
  return a.x + (a.map.x_per_slot ? p : p / a.map.k) * in;
}

// Norm weights of this thread's elements i = threadIdx.x + j * kThreads (j < kNormRegs), loaded before pdl_wait:
// they are weights, and a loop of dependent global loads after the wait would sit on the step's critical path.
constexpr int kNormRegs = 8;  // all of a 2048-wide row; wider rows load the rest after the wait

// load_norm_raw and convert_norm are load_norm's two steps: the loads (raw words: f32 bits, or f16 / bf16 bits in the
// low half) issued before a block's weight copies, which would otherwise queue ahead of them (~3.5 us before the first
// layer's q/k/v could normalize, where no kernel before it hides the wait), and their conversion once the copies are
// issued.
__device__ __forceinline__ void load_norm_raw(const GemvArgs& a, int64_t in, uint32_t (&raw)[kNormRegs]) {
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    raw[j] = 0u;
    if (a.f.norm_w && i < in) {
      raw[j] = a.f.norm_type == FloatType::kF32 ? static_cast<const uint32_t*>(a.f.norm_w)[i]
                                                : static_cast<const unsigned short*>(a.f.norm_w)[i];
    }
  }
}
__device__ __forceinline__ void convert_norm(const GemvArgs& a, const uint32_t (&raw)[kNormRegs],
                                             float (&nw)[kNormRegs]) {
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) {
    switch (a.f.norm_type) {
      case FloatType::kF16: nw[j] = __half2float(__ushort_as_half(static_cast<unsigned short>(raw[j]))); break;
      case FloatType::kBF16: nw[j] = __uint_as_float(raw[j] << 16); break;  // exactly __bfloat162float
      default: nw[j] = __uint_as_float(raw[j]); break;
    }
  }
}
__device__ __forceinline__ void load_norm(const GemvArgs& a, int64_t in, float (&nw)[kNormRegs]) {
  uint32_t raw[kNormRegs];
  load_norm_raw(a, in, raw);
  convert_norm(a, raw, nw);
}

// The staged x (padded chunk layout) becomes rms_norm(x) * weight, exactly as rms_norm_kernel computes it (the same
// thread count and order of the sum of squares); block 0 of each pair also writes it to xn_out. Ends with a barrier.
__device__ inline void normalize_staged(const GemvArgs& a, int64_t in, int64_t p, float* xs,
                                        const float (&nw)[kNormRegs]) {
  __shared__ float red[32];
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < in; i += kThreads) {
    const float v = xs[(i / kChunk) * kChunkPad + i % kChunk];
    ss = fmaf(v, v, ss);
  }
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(in) + a.f.eps);
  float* xn = a.f.xn_out && blockIdx.x == 0 ? a.f.xn_out + p * in : nullptr;
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) {
    const int64_t i = threadIdx.x + int64_t(j) * kThreads;
    if (i < in) {
      float& v = xs[(i / kChunk) * kChunkPad + i % kChunk];
      v = v * inv * nw[j];
      if (xn) xn[i] = v;
    }
  }
  for (int64_t i = threadIdx.x + int64_t(kNormRegs) * kThreads; i < in; i += kThreads) {
    float& v = xs[(i / kChunk) * kChunkPad + i % kChunk];
    v = v * inv * load_float(a.f.norm_w, a.f.norm_type, i);
    if (xn) xn[i] = v;
  }
  __syncthreads();
}

// stage_chunks of x, then normalize_staged, in one pass where the row is kNormRegs * kThreads wide: each thread's
// elements (those of its norm weights) stay in registers from their loads to their one store to xs, so the same sum
// of squares in the same order and the same products, bit for bit, with one barrier and one shared-memory round trip
// fewer. Other widths take the two steps. Ends with a barrier.
__device__ inline void stage_normalized(const GemvArgs& a, int64_t in, int64_t p, const float* x, float* xs,
                                        const float (&nw)[kNormRegs]) {
  if (in != int64_t(kNormRegs) * kThreads) {
    stage_chunks(x, in, xs);
    __syncthreads();
    normalize_staged(a, in, p, xs, nw);
    return;
  }
  __shared__ float red[32];
  float v[kNormRegs];
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) v[j] = x[threadIdx.x + j * kThreads];
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) ss = fmaf(v[j], v[j], ss);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(in) + a.f.eps);
  float* xn = a.f.xn_out && blockIdx.x == 0 ? a.f.xn_out + p * in : nullptr;
#pragma unroll
  for (int j = 0; j < kNormRegs; ++j) {
    const int i = threadIdx.x + j * kThreads;
    const float y = v[j] * inv * nw[j];
    xs[(i / kChunk) * kChunkPad + i % kChunk] = y;
    if (xn) xn[i] = y;
  }
  __syncthreads();
}

// Router epilogue: the block that finishes last runs the top-k of every token's logits (y of part 0), the whole
// block per token (block_router_topk), then resets the counter for the next launch.
__device__ inline void router_epilogue(const GemvArgs& a) {
  static_assert(kThreads == kRankThreads, "block_router_topk needs the whole block");
  __shared__ bool last;
  __shared__ RouterRankSmem rs;
  __syncthreads();  // every warp of this block has written its logits
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned total = gridDim.x * gridDim.y;
    last = atomicAdd(a.f.counter, 1u) == total - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const RouterEpilogue& r = a.f.router;
  for (int64_t t = 0; t < gridDim.y; ++t) {
    block_router_topk(a.y[0] + t * a.w[0].out, int(a.w[0].out), r.k, r.topk_softmax, r.renormalize, r.indices + t * r.k,
                      r.weights + t * r.k, rs);
  }
  if (threadIdx.x == 0) *a.f.counter = 0u;
}

// ---- the router share (RouterShare, qmatmul.cuh) of a projection's block of R = kWarps * RPW rows ----
// Its shared memory after the staged x: the router's packed words of the block's columns (n_experts x W words),
// their scale and bias, the norm weights and y * norm_w of the block's rows, and the warps' sums of squares.
struct ShareSmem {
  uint32_t* words;
  float *scale, *bias, *norm_w, *yn, *ssq;
};

__host__ __device__ inline int64_t share_words(int64_t n_experts, int rows, int bits) {
  return n_experts * rows * bits / 32;
}
__host__ __device__ inline int64_t share_floats(int64_t n_experts, int rows, int bits) {
  return share_words(n_experts, rows, bits) + 2 * n_experts + 2 * rows + kWarps;
}

__device__ __forceinline__ ShareSmem share_smem(float* base, int64_t n_experts, int rows, int bits) {
  ShareSmem m;
  m.words = reinterpret_cast<uint32_t*>(base);
  m.scale = base + share_words(n_experts, rows, bits);
  m.bias = m.scale + n_experts;
  m.norm_w = m.bias + n_experts;
  m.yn = m.norm_w + rows;
  m.ssq = m.yn + rows;
  return m;
}

// Before the wait: the router's words, scales and biases of columns [r0, r0 + rows) (one group: the group size is
// a multiple of rows) and the norm weights of those rows, into shared memory (weights only, never written by
// kernels). The next barrier publishes them. A thread's first word, scale, bias and norm weight are all loaded
// before its first store (the compiler keeps loads behind stores that might alias them: one round trip each).
__device__ inline void share_load(const RouterShare& s, int64_t r0, int rows, const ShareSmem& m) {
  const int bits = s.w.bits;
  const int64_t n_experts = s.w.out, d = s.w.in, per_expert = rows * bits / 32, groups = d / s.w.group_size;
  const uint32_t* w = static_cast<const uint32_t*>(s.w.w);
  const int64_t g = r0 / s.w.group_size, n_words = n_experts * per_expert;
  auto word = [&](int64_t i) { return w[(i / per_expert) * (d * bits / 32) + r0 * bits / 32 + i % per_expert]; };
  auto scale = [&](int64_t e) { return load_float(s.w.scales, s.w.stype, e * groups + g); };
  auto bias = [&](int64_t e) { return s.w.biases ? load_float(s.w.biases, s.w.stype, e * groups + g) : 0.0f; };
  const int64_t t = threadIdx.x;
  const uint32_t w0 = t < n_words ? word(t) : 0u;
  const float s0 = t < n_experts ? scale(t) : 0.0f, b0 = t < n_experts ? bias(t) : 0.0f;
  const float n0 = t < rows ? load_float(s.norm_w, s.norm_type, r0 + t) : 0.0f;
  if (t < n_words) m.words[t] = w0;
  if (t < n_experts) {
    m.scale[t] = s0;
    m.bias[t] = b0;
  }
  if (t < rows) m.norm_w[t] = n0;
  for (int64_t i = t + kThreads; i < n_words; i += kThreads) m.words[i] = word(i);
  for (int64_t e = t + kThreads; e < n_experts; e += kThreads) {
    m.scale[e] = scale(e);
    m.bias[e] = bias(e);
  }
  for (int64_t i = t + kThreads; i < rows; i += kThreads) m.norm_w[i] = load_float(s.norm_w, s.norm_type, r0 + i);
}

// After the block's rows are in m.yn (y * norm_w) and m.ssq (per warp): every expert's part of the logits and the
// block's sum of squares, written to parts[token][block][e] and sumsq[token][block].
__device__ inline void share_store(const RouterShare& s, int rows, int64_t token, int64_t block, int64_t blocks,
                                   const ShareSmem& m) {
  __syncthreads();
  const int bits = s.w.bits, per_expert = rows * bits / 32;
  const uint32_t mask = (1u << bits) - 1u;
  const int64_t n_experts = s.w.out;
  for (int64_t e = threadIdx.x; e < n_experts; e += kThreads) {
    float qy = 0.0f, ysum = 0.0f;  // sum_r q[e, r] * yn[r] and sum_r yn[r]: dequantized as scale * qy + bias * ysum
    for (int r = 0; r < rows; ++r) {
      const uint32_t word = m.words[e * per_expert + r * bits / 32];
      const float q = float((word >> ((r * bits) % 32)) & mask);
      qy = fmaf(q, m.yn[r], qy);
      ysum += m.yn[r];
    }
    s.parts[(token * blocks + block) * n_experts + e] = fmaf(m.scale[e], qy, m.bias[e] * ysum);
  }
  if (threadIdx.x == 0) {
    float ss = 0.0f;
    for (int w = 0; w < kWarps; ++w) ss += m.ssq[w];
    s.sumsq[token * blocks + block] = ss;
  }
}

// The bulk-copy kernel (gemv_bulk.cu) for 4-/8-bit weights whose rows can be bulk-copied: one token of a normalized x
// (a.f.norm_w set, no residual, router or share) when Ctx::gemv_bulk is on, or gather pairs (a.map.indices, no
// fusion) when Ctx::gemv_bulk_gather is; each block's rows go to shared memory, bit for bit qgemv_kernel's sums.
// Returns false, launching nothing, otherwise.
bool launch_gemv_bulk(const Ctx& ctx, GemvArgs& a, int64_t n_pairs);

// A 4-/8-bit weight with biases whose rows the bulk-copy kernels can copy (16-byte aligned rows, scales and biases)
// and that the tensor-core kernel of launch_gemv_mma does not take.
bool bulk_weight_ok(const Ctx& ctx, const WeightView& w);

// The one-token normalized product of launch_gemv_bulk on int8 tensor cores (gemv_bulk_imma.cu) where Ctx::gemv_imma
// is on: 4-/8-bit weights of group size 32, 64 or 128, whole 16-row tiles, no xn_out; false (launching nothing)
// otherwise. launch_gemv_bulk tries it first.
bool launch_gemv_bulk_imma(const Ctx& ctx, GemvArgs& a);

// One token of the output projection's form, y = residual + x @ w^T (a.f.residual, no norm, one 4-/8-bit weight in
// whole 16-row tiles, group size 32, 64 or 128), with the router's share where a.f.share asks (parts of 16 or 8 rows,
// a block writing one or two), on int8 tensor cores (gemv_bulk_imma.cu) where Ctx::gemv_residual_imma is on; false
// (launching nothing) otherwise.
bool launch_gemv_residual_imma(const Ctx& ctx, GemvArgs& a);

// Rows from which one token of a single matrix goes to the streaming kernel (gemv_stream.cu).
constexpr int64_t kStreamRows = 16384;

// The streaming kernel (gemv_stream.cu) for one token of one 4-/8-bit matrix of at least kStreamRows rows whose rows
// can be bulk-copied (a.f: the norm only), when Ctx::gemv_stream is on: on tensor cores where Ctx::gemv_stream_mma is
// on and the shape allows (f32 rounding of gemv_bulk_kernel's sums), else bit for bit gemv_bulk_kernel's sums.
// Returns false, launching nothing, otherwise.
bool launch_gemv_stream(const Ctx& ctx, GemvArgs& a, const ArgmaxTail* tail = nullptr);

// The tensor-core kernel (qgemv_mma.cu) for 4- and 8-bit weights with group size 32, 64 or 128, when x and its
// working set fit in shared memory. Returns false, launching nothing, otherwise (a.part_end is filled here).
bool launch_gemv_mma(const Ctx& ctx, GemvArgs& a, int64_t n_pairs);
// Whether launch_gemv_mma takes this weight (the fused decode-MoE kernels ask it too, so that the fused and the
// gather paths always run the same arithmetic).
bool gemv_mma_takes(const Ctx& ctx, const WeightView& w);

}  // namespace moecel::cuda::gemv
