// Attention: one block of W warps per (head, token) (W = 16 for decode, 4 for prefill). Warp w takes cache rows
// first + w, first + w + W, ...;
// each lane holds head_dim / 32 dims (lane + 32 j: coalesced rows), the warp reduces q . k with shuffles and
// keeps its own online-softmax state (max, sum, weighted V); the W states are merged through shared memory. A decode
// warp's first rows are loaded before the kernel's wait (EarlyRows).
// Decode uses it; prefill takes the tiled kernel (attention_prefill.cu) and falls back to this one (grid.y = tokens)
// for head sizes that kernel does not take. Split-K for long contexts is a later step.
#include "backend/cuda/attention.cuh"
#include "backend/cuda/norm_rope.cuh"

namespace moecel::cuda {
namespace {

// Decode has one block per head only: 16 warps each walk a sixteenth of the cache rows, so the chain of dependent
// row loads per warp stays short. Prefill has a block per (head, token) and keeps 4.
constexpr int kDecodeWarps = 16;
constexpr int kPrefillWarps = 4;
// Cache rows per decode warp loaded before the wait (EarlyRows): 16 warps x 4 = the first 64 rows of a head. The
// q/k-norm block takes them; the plain decode kernel does not (64 registers there, spilling: Qwen3-shaped tg64 -0.45%).
constexpr int kEarlyRows = 4;

// Requests this block's kv head's latest `rows` cache rows before pos0 into L2 (K and V), before the wait: earlier
// steps wrote them, so the attention's loads after the wait hit L2 instead of DRAM. Rows below `skip_below` are
// skipped (the early rows, already loaded).
__device__ __forceinline__ void prefetch_cache_rows(const float* kc, const float* vc, int64_t kv_width, int64_t kv_off,
                                                    int head_dim, int64_t pos0, int window, int rows,
                                                    int64_t skip_below = 0) {
  const int64_t first = window > 0 ? max(int64_t(0), pos0 - window + 1) : 0;
  const int64_t from = max(max(first, skip_below), pos0 - rows);
  const int lines = (head_dim + 31) / 32;  // 128-byte lines per row
  for (int64_t i = threadIdx.x; i < (pos0 - from) * lines; i += blockDim.x) {
    const int64_t off = (from + i / lines) * kv_width + kv_off + (i % lines) * 32;
    asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + off));
    asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + off));
  }
}

// A warp's first kPre cache rows (first + warp + b kWarps, b < kPre), loaded before the kernel's wait: rows below
// `last` were written by earlier steps, whose kernels have all finished when this block starts (launches overlap
// only their neighbours: see pdl_wait), so these loads overlap the kernel before. Row `last` is this step's:
// attend_rows folds it from the block's shared memory. kPre == 0 holds nothing.
template <int VPL, int kPre>
struct EarlyRows {
  float k[kPre > 0 ? kPre : 1][VPL], v[kPre > 0 ? kPre : 1][VPL];
};

template <int VPL, int kWarps, int kPre>
__device__ __forceinline__ void load_early_rows(EarlyRows<VPL, kPre>& e, const float* kc, const float* vc,
                                                int64_t kv_width, int64_t kv_off, int64_t first, int64_t last,
                                                int head_dim) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int b = 0; b < kPre; ++b) {
    const int64_t p = first + warp + int64_t(b) * kWarps;
#pragma unroll
    for (int j = 0; j < VPL; ++j) {
      const int d = lane + 32 * j;
      const bool ok = p < last && d < head_dim;
      e.k[b][j] = ok ? kc[p * kv_width + kv_off + d] : 0.0f;
      e.v[b][j] = ok ? vc[p * kv_width + kv_off + d] : 0.0f;
    }
  }
}

// Folds one row (score s, values v) into a warp's online-softmax state.
template <int VPL>
__device__ __forceinline__ void fold_row(float s, const float (&v)[VPL], float& m, float& l, float (&acc)[VPL]) {
  const float m_new = fmaxf(m, s);
  const float corr = m == -INFINITY ? 0.0f : expf(m - m_new);  // rescales the old state to the new max
  const float pw = expf(s - m_new);
  l = l * corr + pw;
#pragma unroll
  for (int j = 0; j < VPL; ++j) acc[j] = fmaf(pw, v[j], acc[j] * corr);
  m = m_new;
}

// q . k for one row of a warp (dims lane + 32 j), reduced over the warp and scaled.
template <int VPL>
__device__ __forceinline__ float row_score(const float (&qv)[VPL], const float (&k)[VPL], int head_dim, float scale) {
  const int lane = threadIdx.x & 31;
  float dot = 0.0f;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    if (lane + 32 * j < head_dim) dot = fmaf(qv[j], k[j], dot);
  }
  return warp_sum(dot) * scale;
}

// One query row (qv: dims lane + 32 j, every warp holding all of them) against cache rows [first, last] of one kv head
// (columns kv_off ..), written to o[0, head_dim). Warp w takes rows first + w, first + w + kWarps, ...
// With early rows (the q/k-norm block), row `last` is this block's own: its warp folds it last (its place in that
// warp's order) from step_k / step_v in shared memory instead of reloading the cache row the block has just written
// (an L2 round trip after the barrier, on the merge's path).
template <int VPL, int kWarps, int kPre>
__device__ __forceinline__ void attend_rows(const float (&qv)[VPL], EarlyRows<VPL, kPre>& e, const float* kc,
                                            const float* vc, int64_t kv_width, int64_t kv_off, int64_t first,
                                            int64_t last, int head_dim, float scale, float* o,
                                            const float* step_k = nullptr, const float* step_v = nullptr) {
  constexpr bool kStep = kPre > 0;              // row `last` from step_k / step_v
  const int64_t end = kStep ? last : last + 1;  // rows [first, end) come from the cache
  constexpr int kThreads = kWarps * 32;
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][kMaxHeadDim];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float acc[VPL];
#pragma unroll
  for (int j = 0; j < VPL; ++j) acc[j] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  if constexpr (kPre > 0) {  // the early rows first: the same rows in the same order as the loop below would take
    float sb[kPre];
#pragma unroll
    for (int b = 0; b < kPre; ++b) {  // only rows that exist (uniform over the warp): short contexts skip the rest
      sb[b] = first + warp + int64_t(b) * kWarps < end ? row_score(qv, e.k[b], head_dim, scale) : 0.0f;
    }
#pragma unroll
    for (int b = 0; b < kPre; ++b) {
      if (first + warp + int64_t(b) * kWarps >= end) break;  // uniform over the warp
      fold_row(sb[b], e.v[b], m, l, acc);
    }
  }
  // The other rows are taken kBatch at a time, their K and V loads all issued before any is used: row by row, each
  // row's loads waited for the previous row's softmax step, a chain of memory round trips that made decode
  // attention ~6 us of each OLMoE layer. The rows are still folded in the same order (same results).
  constexpr int kBatch = 4;
  for (int64_t p0 = first + warp + int64_t(kPre) * kWarps; p0 < end; p0 += int64_t(kWarps) * kBatch) {
    float kv[kBatch][VPL], vv[kBatch][VPL];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int64_t p = p0 + int64_t(b) * kWarps;
      const float* kr = kc + p * kv_width + kv_off;
      const float* vr = vc + p * kv_width + kv_off;
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        const int d = lane + 32 * j;
        const bool ok = p < end && d < head_dim;
        kv[b][j] = ok ? kr[d] : 0.0f;
        vv[b][j] = ok ? vr[d] : 0.0f;
      }
    }
    float sb[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
      sb[b] = p0 + int64_t(b) * kWarps < end ? row_score(qv, kv[b], head_dim, scale) : 0.0f;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (p0 + int64_t(b) * kWarps >= end) break;  // uniform over the warp
      fold_row(sb[b], vv[b], m, l, acc);
    }
  }
  if constexpr (kStep) {
    if (warp == int((last - first) % kWarps)) {  // uniform over the warp
      float k[VPL], v[VPL];
#pragma unroll
      for (int j = 0; j < VPL; ++j) {
        const int d = lane + 32 * j;
        k[j] = d < head_dim ? step_k[d] : 0.0f;
        v[j] = d < head_dim ? step_v[d] : 0.0f;
      }
      fold_row(row_score(qv, k, head_dim, scale), v, m, l, acc);
    }
  }
  probe_mark_max(2);
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int d = lane + 32 * j;
    if (d < head_dim) s_acc[warp][d] = acc[j];
  }
  __syncthreads();
  // Merge, by the warps that write the output only (every warp computing the weights took issue slots from them):
  // the global max is finite (row `last` is always attended); a warp that saw no row has m = -inf, l = 0. Lane w
  // computes warp w's weight once; the others read it by shuffle (the same values, added in warp order).
  static_assert(kWarps <= 32, "one lane per warp's weight");
  if (threadIdx.x >= (head_dim + 31) / 32 * 32) return;  // whole warps: the shuffles below need every lane
  float mx = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, s_m[w]);
  const float own = lane < kWarps && s_m[lane] != -INFINITY ? expf(s_m[lane] - mx) : 0.0f;
  float wgt[kWarps], sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    wgt[w] = __shfl_sync(0xffffffffu, own, w);
    sum = fmaf(s_l[w], wgt[w], sum);
  }
  const float inv = 1.0f / sum;
  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v = fmaf(s_acc[w][d], wgt[w], v);
    o[d] = v * inv;
  }
}

// Preconditions: blockDim.x == 32 * kWarps; grid (n_heads, n_tokens); head_dim <= 32 * VPL <= kMaxHeadDim;
// n_heads % n_kv_heads == 0; cache rows [0, pos0 + n_tokens) exist.
template <int VPL, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    attention_kernel(const float* q, const float* kc, const float* vc, int64_t pos0, const int64_t* step_pos,
                     int n_heads, int n_kv_heads, int head_dim, float scale, int window, float* out,
                     int prefetch_rows) {
  if (step_pos) pos0 = *step_pos;  // written before the graph's replay, never by a kernel: read before the wait
  const int h = blockIdx.x;
  const int64_t t = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  const int64_t kv_off = int64_t(h / (n_heads / n_kv_heads)) * head_dim;
  const int64_t last = pos0 + t;
  const int64_t first = window > 0 ? max(int64_t(0), last - window + 1) : 0;
  if (prefetch_rows > 0 && gridDim.y == 1) {
    prefetch_cache_rows(kc, vc, kv_width, kv_off, head_dim, pos0, window, prefetch_rows);
  }
  pdl_enter();
  float qv[VPL];
  const float* qr = q + t * q_width + int64_t(h) * head_dim;
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < head_dim ? qr[d] : 0.0f;
  }
  EarlyRows<VPL, 0> none;  // no early rows here (see kEarlyRows)
  attend_rows<VPL, kWarps, 0>(qv, none, kc, vc, kv_width, kv_off, first, last, head_dim, scale,
                              out + t * q_width + int64_t(h) * head_dim);
}

// The decode attention block of one query head in one launch: launch_qk_norm_rope_store's full-width norms (every
// block adds all squares of q and k, in that kernel's order: this thread stands for its threads u and u + 512), the
// rotary of this head's q and of its kv head's k, that k and v written to cache row pos0 (by every block of a GQA
// group, the same values), then attend_rows. The same bits as the two launches; q and k are not written back.
// One dependent launch less per layer. Preconditions: blockDim.x == kFusedThreads; grid (n_heads); one token;
// widths <= kQkNormThreads * kQkNormPer; head_dim <= 32 * VPL <= kMaxHeadDim; 0 < half, 2 * half <= head_dim.
constexpr int kFusedThreads = kDecodeWarps * 32;
static_assert(2 * kFusedThreads == kQkNormThreads, "a thread stands for two of qk_norm_rope_store's");

template <int VPL, int kPre>
__global__ void __launch_bounds__(kFusedThreads)
    qk_norm_rope_attention_kernel(const float* q, const float* k, const float* v, const void* q_norm, FloatType q_wtype,
                                  const void* k_norm, FloatType k_wtype, float eps, int n_heads, int n_kv_heads,
                                  int head_dim, int half, RopeFreqs freqs, int64_t pos0, const int64_t* step_pos,
                                  int64_t capacity, float* kc, float* vc, float scale, int window, float* out,
                                  int prefetch_rows) {
  __shared__ float red[2][32];
  // hq, hk: the normalized head; rq, rk: rotated (apart, so that no barrier has to separate reading the first from
  // writing the second); hv: this step's v row.
  __shared__ float hq[kMaxHeadDim], hk[kMaxHeadDim], rq[kMaxHeadDim], rk[kMaxHeadDim], hv[kMaxHeadDim];
  if (step_pos) pos0 = *step_pos;
  const int h = blockIdx.x, g = h / (n_heads / n_kv_heads);
  const int u = threadIdx.x, warp = u >> 5, lane = u & 31;
  const int64_t q_width = int64_t(n_heads) * head_dim, kv_width = int64_t(n_kv_heads) * head_dim;
  const int64_t q_off = int64_t(h) * head_dim, kv_off = int64_t(g) * head_dim;
  const bool mine = u < head_dim;  // this thread's element of the head
  const float nq = mine ? load_float(q_norm, q_wtype, q_off + u) : 0.0f;
  const float nk = mine ? load_float(k_norm, k_wtype, kv_off + u) : 0.0f;
  float sn = 0.0f, cs = 1.0f;  // this element's rotary angle: the position is known before the wait
  if (mine && u < 2 * half) rope_angle(u, half, float(pos0), freqs, sn, cs);
  const int64_t first = window > 0 ? max(int64_t(0), pos0 - window + 1) : 0;
  EarlyRows<VPL, kPre> e;
  load_early_rows<VPL, kDecodeWarps, kPre>(e, kc, vc, kv_width, kv_off, first, pos0, head_dim);
  prefetch_cache_rows(kc, vc, kv_width, kv_off, head_dim, pos0, window, prefetch_rows,
                      first + int64_t(kPre) * kDecodeWarps);
  pdl_enter();
  float sq[2], sk[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t t = u + i * kFusedThreads;
    float xq[kQkNormPer], xk[kQkNormPer];
#pragma unroll
    for (int j = 0; j < kQkNormPer; ++j) {
      const int64_t e = t + int64_t(j) * kQkNormThreads;
      xq[j] = e < q_width ? q[e] : 0.0f;
      xk[j] = e < kv_width ? k[e] : 0.0f;
    }
    sq[i] = sk[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kQkNormPer; ++j) {
      sq[i] = fmaf(xq[j], xq[j], sq[i]);
      sk[i] = fmaf(xk[j], xk[j], sk[i]);
    }
  }
  const float xq = mine ? q[q_off + u] : 0.0f, xk = mine ? k[kv_off + u] : 0.0f, xv = mine ? v[kv_off + u] : 0.0f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // block_sum's first step for the 1024 threads: warp w + 16 i of them
    sq[i] = warp_sum(sq[i]);
    sk[i] = warp_sum(sk[i]);
    if (lane == 0) {
      red[0][warp + 16 * i] = sq[i];
      red[1][warp + 16 * i] = sk[i];
    }
  }
  __syncthreads();
  probe_mark(0);
  if (warp * 32 < head_dim) {  // the warps holding the head's elements (whole warps: shuffles); the others skip
    const float inv_q = 1.0f / sqrtf(warp_sum(red[0][lane]) / float(q_width) + eps);
    const float inv_k = 1.0f / sqrtf(warp_sum(red[1][lane]) / float(kv_width) + eps);
    if (mine) {
      hq[u] = xq * inv_q * nq;
      hk[u] = xk * inv_k * nk;
    }
  }
  __syncthreads();
  if (mine) {  // the rotated q, and this step's k and v row for attend_rows
    const float oq = u < 2 * half ? rope_rotate(hq, u, half, sn, cs) : hq[u];
    const float ok = u < 2 * half ? rope_rotate(hk, u, half, sn, cs) : hk[u];
    rq[u] = oq;
    rk[u] = ok;
    hv[u] = xv;
    if (pos0 >= 0 && pos0 < capacity) {
      kc[pos0 * kv_width + kv_off + u] = ok;
      vc[pos0 * kv_width + kv_off + u] = xv;
    }
  }
  __syncthreads();
  float qv[VPL];
#pragma unroll
  for (int j = 0; j < VPL; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < head_dim ? rq[d] : 0.0f;
  }
  probe_mark(1);
  attend_rows<VPL, kDecodeWarps, kPre>(qv, e, kc, vc, kv_width, kv_off, first, pos0, head_dim, scale, out + q_off, rk,
                                       hv);
  probe_mark(3);
}

template <int VPL>
void launch_vpl(const Ctx& ctx, dim3 grid, const float* q, const float* kc, const float* vc, int64_t pos0, int n_heads,
                int n_kv_heads, int head_dim, float scale, int window, float* out) {
  if (grid.y == 1) {
    launch_k(ctx, attention_kernel<VPL, kDecodeWarps>, grid, kDecodeWarps * 32, 0, q, kc, vc, pos0, ctx.step_pos,
             n_heads, n_kv_heads, head_dim, scale, window, out, ctx.kv_prefetch_rows);
  } else {
    launch_k(ctx, attention_kernel<VPL, kPrefillWarps>, grid, kPrefillWarps * 32, 0, q, kc, vc, pos0, ctx.step_pos,
             n_heads, n_kv_heads, head_dim, scale, window, out, 0);
  }
}

}  // namespace

void launch_attention(const Ctx& ctx, const float* q, const float* k_cache, const float* v_cache, int64_t pos0,
                      int64_t n_tokens, int n_heads, int n_kv_heads, int head_dim, float scale, int window,
                      float* out) {
  if (n_tokens == 0 || n_heads == 0) return;
  CUDA_REQUIRE(head_dim > 0 && head_dim <= kMaxHeadDim, "attention: head_dim must be in [1, 256]");
  CUDA_REQUIRE(n_kv_heads > 0 && n_heads % n_kv_heads == 0, "attention: n_heads must be a multiple of n_kv_heads");
  CUDA_REQUIRE(pos0 >= 0 && n_tokens <= 65535, "attention: bad pos0 / token count");
  if (launch_attention_prefill(ctx, q, k_cache, v_cache, pos0, n_tokens, n_heads, n_kv_heads, head_dim, scale, window,
                               out)) {
    return;
  }
  const dim3 grid{unsigned(n_heads), unsigned(n_tokens)};
  switch ((head_dim + 31) / 32) {
#define MOECEL_ATTN_CASE(V) \
  case V: launch_vpl<V>(ctx, grid, q, k_cache, v_cache, pos0, n_heads, n_kv_heads, head_dim, scale, window, out); break;
    MOECEL_ATTN_CASE(1)
    MOECEL_ATTN_CASE(2)
    MOECEL_ATTN_CASE(3)
    MOECEL_ATTN_CASE(4)
    MOECEL_ATTN_CASE(5)
    MOECEL_ATTN_CASE(6)
    MOECEL_ATTN_CASE(7)
    MOECEL_ATTN_CASE(8)
#undef MOECEL_ATTN_CASE
  }
}

bool launch_qk_norm_rope_attention(const Ctx& ctx, const QkNormRopeAttention& a) {
  const int64_t q_width = int64_t(a.n_heads) * a.head_dim, kv_width = int64_t(a.n_kv_heads) * a.head_dim;
  if (a.half <= 0 || 2 * a.half > a.head_dim || a.head_dim > kMaxHeadDim || a.n_kv_heads <= 0 ||
      a.n_heads % a.n_kv_heads != 0 || q_width > kQkNormThreads * kQkNormPer ||
      kv_width > kQkNormThreads * kQkNormPer) {
    return false;
  }
  CUDA_REQUIRE(a.half <= kMaxRopeHalf && a.pos0 >= 0, "qk_norm_rope_attention: bad rotary dims or position");
  auto go = [&](auto kernel) {
    launch_k(ctx, kernel, dim3(unsigned(a.n_heads)), kFusedThreads, 0, a.q, a.k, a.v, a.q_norm, a.q_wtype, a.k_norm,
             a.k_wtype, a.eps, a.n_heads, a.n_kv_heads, a.head_dim, a.half, *a.freqs, a.pos0, ctx.step_pos, a.capacity,
             a.k_cache, a.v_cache, a.scale, a.window, a.out, ctx.kv_prefetch_rows);
  };
  switch ((a.head_dim + 31) / 32) {
    case 1: go(qk_norm_rope_attention_kernel<1, kEarlyRows>); break;
    case 2: go(qk_norm_rope_attention_kernel<2, kEarlyRows>); break;
    case 3: go(qk_norm_rope_attention_kernel<3, kEarlyRows>); break;
    case 4: go(qk_norm_rope_attention_kernel<4, kEarlyRows>); break;
    case 5: go(qk_norm_rope_attention_kernel<5, kEarlyRows>); break;
    case 6: go(qk_norm_rope_attention_kernel<6, kEarlyRows>); break;
    case 7: go(qk_norm_rope_attention_kernel<7, kEarlyRows>); break;
    default: go(qk_norm_rope_attention_kernel<8, kEarlyRows>); break;
  }
  return true;
}

}  // namespace moecel::cuda
