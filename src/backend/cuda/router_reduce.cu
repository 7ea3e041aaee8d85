// The router of a MoE block from the shares its preceding output projection computed (RouterShare, qmatmul.cuh):
// one block per token sums the parts in block order, applies the norm's one factor, writes xn and the logits and
// runs the block top-k. It replaces the router's own matrix-vector launch on the decode step's chain.
// Used by: CudaBackend::linear_residual_norm_router.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {
namespace {

constexpr int kYRegs = 8;   // y and norm values per thread held in registers: a 2048-wide row
constexpr int kBatch = 32;  // parts loaded at once per thread

// Preconditions (launch_router_reduce_topk): blockDim.x == kRankThreads; 1 <= n_experts <= 32 * kPerLane <= 256;
// 1 <= k <= min(n_experts, 32). kBulk: the parts, y and the sums of squares are first moved into shared memory by
// three bulk copies (router_bulk_bytes; spans 16-byte aligned multiples of 16 bytes), the same sums in the same order.
// kExact (fast_shape): n_experts == 32 * kPerLane, d == kYRegs * kRankThreads and blocks a multiple of a batch, so the
// expert count, d and every load's offset are compile-time constants: the same sums in the same order with no bounds
// tests or index arithmetic (the kernel is bound by its instruction count on one SM).
template <int kPerLane, bool kBulk, bool kExact>
__global__ void __launch_bounds__(kRankThreads) router_reduce_topk_kernel(RouterReduce r) {
  extern __shared__ float4 rsm4[];  // kBulk: parts (blocks, n_experts), y (d), sumsq (blocks)
  __shared__ RouterRankSmem rank;
  __shared__ float red[32];
  __shared__ float sums[kRankThreads];
  __shared__ uint64_t bar;
  const int64_t t = blockIdx.x, d = kExact ? int64_t(kYRegs) * kRankThreads : r.d;
  const int tid = threadIdx.x, n_e = kExact ? 32 * kPerLane : r.n_experts;
  float nw[kYRegs];
#pragma unroll
  for (int j = 0; j < kYRegs; ++j) {
    const int64_t i = tid + int64_t(j) * kRankThreads;
    nw[j] = i < d ? load_float(r.norm_w, r.norm_type, i) : 0.0f;
  }
  if constexpr (kBulk) {
    if (tid == 0) mbar_init(&bar, 1);
    __syncthreads();
  }
  pdl_enter();
  const float* parts = r.parts + t * int64_t(r.blocks) * n_e;
  const float* ys = r.y + t * d;
  const float* sq = r.sumsq + t * r.blocks;
  if constexpr (kBulk) {
    float* sp = reinterpret_cast<float*>(rsm4);
    float* sy = sp + int64_t(r.blocks) * n_e;
    float* ssq = sy + d;
    if (tid == 0) {
      const unsigned pb = unsigned(r.blocks) * n_e * 4, yb = unsigned(d) * 4, sb = unsigned(r.blocks) * 4;
      mbar_arrive_expect(&bar, pb + yb + sb);
      bulk_copy(sp, parts, pb, &bar);
      bulk_copy(sy, ys, yb, &bar);
      bulk_copy(ssq, sq, sb, &bar);
    }
    mbar_wait(&bar, 0);
    probe_mark(0);
    parts = sp;
    ys = sy;
    sq = ssq;
  }
  float y[kYRegs];  // loaded first: in flight with the parts
#pragma unroll
  for (int j = 0; j < kYRegs; ++j) {
    const int64_t i = tid + int64_t(j) * kRankThreads;
    y[j] = i < d ? ys[i] : 0.0f;
  }
  float ss = 0.0f;
  for (int b = tid; b < r.blocks; b += kRankThreads) ss += sq[b];
  // Thread (q, e) sums blocks q, q + n_q, ... of expert e in order, its loads issued kBatch at a time (a warp's
  // loads are consecutive experts of one block: coalesced; OLMoE: 128 blocks, 32 per thread, one round trip); the
  // n_q sums are added in q order below.
  const int n_q = kRankThreads / n_e, e = tid % n_e, q = tid / n_e;
  float s = 0.0f;
  if constexpr (kExact) {  // n_q * n_e == kRankThreads: every thread sums; offsets from one base
    for (int b0 = q; b0 < r.blocks; b0 += kBatch * n_q) {
      const float* pb = parts + b0 * n_e + e;
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) v[j] = pb[j * n_q * n_e];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) s += v[j];
    }
  } else if (q < n_q) {
    for (int b0 = q; b0 < r.blocks; b0 += kBatch * n_q) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int b = b0 + j * n_q;
        v[j] = b < r.blocks ? parts[int64_t(b) * n_e + e] : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) s += v[j];
    }
  }
  sums[tid] = s;
  ss = block_sum(ss, red);  // ends with the block synchronized: sums is complete
  probe_mark(1);
  const float inv = 1.0f / sqrtf(ss / float(d) + r.eps);
  if (tid < 32) {  // warp 0: the logits of experts lane + 32 i, straight into the top-k's scores (no barrier between)
    float sc[kPerLane];
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = tid + 32 * i;
      float l = 0.0f;
      if (e < n_e) {
#pragma unroll
        for (int j = 0; j < n_q; ++j) l += sums[j * n_e + e];
        r.logits[t * n_e + e] = l * inv;
      }
      sc[i] = e < n_e ? l * inv : -INFINITY;
    }
    warp_router_scores_regs<kPerLane>(n_e, r.topk_softmax, sc, rank.key);
  }
#pragma unroll
  for (int j = 0; j < kYRegs; ++j) {
    const int64_t i = tid + int64_t(j) * kRankThreads;
    if (i < d) r.xn[t * d + i] = y[j] * inv * nw[j];
  }
  for (int64_t i = tid + int64_t(kYRegs) * kRankThreads; i < d; i += kRankThreads) {
    r.xn[t * d + i] = ys[i] * inv * load_float(r.norm_w, r.norm_type, i);
  }
  probe_mark(2);
  __syncthreads();  // every key is in rank.key
  block_router_rank<kPerLane>(n_e, r.k, r.topk_softmax, r.renormalize, r.indices + t * r.k, r.weights + t * r.k, rank);
  probe_mark(3);
}

// kExact's shape (router_reduce_topk_kernel).
template <int kPerLane>
bool fast_shape(const RouterReduce& r) {
  const int n_q = kRankThreads / (32 * kPerLane);
  return r.n_experts == 32 * kPerLane && r.d == int64_t(kYRegs) * kRankThreads && r.blocks % (kBatch * n_q) == 0;
}

// Shared memory of the bulk variant, or 0 where its spans are not 16-byte multiples or do not fit.
size_t router_bulk_bytes(const Ctx& ctx, const RouterReduce& r) {
  const int64_t pb = int64_t(r.blocks) * r.n_experts * 4, yb = r.d * 4, sb = int64_t(r.blocks) * 4;
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (pb % 16 || yb % 16 || sb % 16 || !aligned(r.parts) || !aligned(r.y) || !aligned(r.sumsq)) return 0;
  const int64_t bytes = pb + yb + sb;
  return bytes <= ctx.max_smem_optin - 16 * 1024 ? size_t(bytes) : 0;  // room for the static shared memory
}

}  // namespace

void launch_router_reduce_topk(const Ctx& ctx, const RouterReduce& r, int64_t n_tokens) {
  if (n_tokens == 0) return;
  CUDA_REQUIRE(r.n_experts >= 1 && r.n_experts <= kWarpRouterExperts && r.k >= 1 && r.k <= r.n_experts && r.k <= 32,
               "router_reduce_topk: 1 to 256 experts and k <= min(n_experts, 32)");
  CUDA_REQUIRE(r.blocks >= 1 && r.d >= 1 && n_tokens < (int64_t(1) << 31), "router_reduce_topk: bad shape");
  const size_t smem = ctx.router_bulk ? router_bulk_bytes(ctx, r) : 0;
  auto go = [&](auto bulk) {
    constexpr bool kBulk = decltype(bulk)::value;
    const bool exact = ctx.router_exact;
    auto kernel = r.n_experts <= 64    ? (exact && fast_shape<2>(r) ? router_reduce_topk_kernel<2, kBulk, true>
                                                                    : router_reduce_topk_kernel<2, kBulk, false>)
                  : r.n_experts <= 128 ? (exact && fast_shape<4>(r) ? router_reduce_topk_kernel<4, kBulk, true>
                                                                    : router_reduce_topk_kernel<4, kBulk, false>)
                                       : router_reduce_topk_kernel<kWarpRouterExperts / 32, kBulk, false>;
    launch_k(ctx, kernel, unsigned(n_tokens), kRankThreads, smem, r);
  };
  smem > 0 ? go(std::true_type{}) : go(std::false_type{});
}

}  // namespace moecel::cuda
