// One-token matrix-vector products on int8 tensor cores: gemv_bulk_kernel's bulk copies before the wait, kernel A's
// group loop (bulk_imma.cuh) after it. Two forms: the input RMSNorm fused (OLMoE's q, k and v; the CUDA-core sums took
// ~1.3 us of q/k/v's ~4.9 us phase once the rows had landed, docs/benchmarks.md, thirty-first tree) and the output
// projection's (y = residual + x @ w^T, with the router's share of its rows where asked:
// linear_residual[_norm_router]). One MMA takes 32 codes here. Results agree with the CUDA-core kernels to the int8
// operand's rounding (2^-22 of a group's largest value), not bit for bit.
#include "backend/cuda/bulk_imma.cuh"
#include "backend/cuda/qgemv.cuh"

namespace moecel::cuda::gemv {
namespace {

using bulk::RowTile;
constexpr int kTileRows = kMmaTileRows;

// After the block's 16 rows are in m.yn and the sums of squares of its 16 / PROW parts in m.ssq: every expert's share
// of the logits for each part, one token. Four threads per expert, four rows each, added in a fixed shuffle tree: in a
// probe build one thread per expert over 16 rows took 0.58 us, this 0.44 (docs/benchmarks.md, thirty-fifth tree).
// ROUTE: each part also added into the route's words (RouteWords).
template <int PROW, bool ROUTE>
__device__ __forceinline__ void share_store_tile(const RouterShare& s, const ShareSmem& m) {
  constexpr int kParts = kTileRows / PROW, kQuarter = kTileRows / 4;
  static_assert(PROW % kQuarter == 0, "a part is whole quarters");
  __syncthreads();
  const int bits = s.w.bits, per_expert = kTileRows * bits / 32, n_experts = int(s.w.out);
  const uint32_t mask = (1u << bits) - 1u;
  const int64_t part0 = int64_t(blockIdx.x) * kParts;
  const int q = threadIdx.x & 3, r0 = q * kQuarter;
  const float y[4] = {m.yn[r0], m.yn[r0 + 1], m.yn[r0 + 2], m.yn[r0 + 3]};
  float ysum = (y[0] + y[1]) + (y[2] + y[3]);
  for (int e0 = 0; e0 < n_experts; e0 += kThreads / 4) {  // uniform trip count: shuffles need every lane
    const int e = e0 + (threadIdx.x >> 2);
    const bool live = e < n_experts;
    float qy = 0.0f;
    if (live) {
      const uint32_t word = m.words[e * per_expert + r0 * bits / 32] >> ((r0 * bits) % 32);
#pragma unroll
      for (int i = 0; i < 4; ++i) qy = fmaf(float((word >> (i * bits)) & mask), y[i], qy);
    }
    float ys = ysum;
#pragma unroll
    for (int off = 1; off < PROW / kQuarter; off <<= 1) {
      qy += __shfl_xor_sync(0xffffffffu, qy, off);
      ys += __shfl_xor_sync(0xffffffffu, ys, off);
    }
    if (live && q % (PROW / kQuarter) == 0) {
      const float v = fmaf(m.scale[e], qy, m.bias[e] * ys);
      s.parts[(part0 + r0 / PROW) * n_experts + e] = v;
      if constexpr (ROUTE) {  // two's complement: the unsigned sum is the signed one; NaN fails the test
        if (fabsf(v) < s.route.limit) {
          atomicAdd(s.route.words + e, static_cast<unsigned long long>(__float2ll_rn(v * 4294967296.0f)));
        } else {
          atomicAdd(s.route.words + n_experts, 1ull);
        }
      }
    }
  }
  if (threadIdx.x < kParts) s.sumsq[part0 + threadIdx.x] = m.ssq[threadIdx.x];
}

// Shared memory: the barrier, kTiles 16-row tiles (rows r0 + 16 m .. of its part, each RowTile's layout), x's three
// digit planes, its groups' (sum, 2^-S) pairs, the warps' partial sums (kWarps, 16 kTiles), then (RES with a share)
// the router share's ShareSmem. Warp w takes groups [w, w + 1) * groups / kWarps of every tile, kRot at a time; each
// row adds the warps' sums in warp order. Probe marks: 0 x staged, 1 rows landed, 3 products summed, 2 done.
// RES: x as it is (no norm), y = residual + x @ w^T (a.f.residual, which may be y); SHARE (RES only): 0, or the rows
// of the router share's parts (a.f.share.rows, 16 or 8: one or two per block, one tile per block). Each a variant of
// its own, so that none carries another's code (a runtime part width cost OLMoE's o projection 0.4%). ROUTE (SHARE
// only): the parts also go into the route's words, and block 0 empties its slots.
template <int BITS, int GS, typename ST, int kTiles, bool RES, int SHARE, bool ROUTE = false>
__global__ void __launch_bounds__(kThreads, 4) gemv_bulk_imma_kernel(GemvArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ float red[32];
  constexpr int kRows = kTiles * kTileRows;
  const Part pt = block_part(a);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
  const int64_t in = pt.w.in, n_oct = in / 8, groups = in / GS, r0 = pt.block * kRows;
  const int64_t row_bytes = bulk::packed_row_bytes(in, BITS), srow = bulk::scale_row_bytes<ST>(in, GS);
  const int64_t tile_bytes = RowTile<BITS, ST>::bytes(kTileRows, row_bytes, srow);
  const int64_t plane = bulk::imma_plane_bytes<GS>(in);
  auto* bar = reinterpret_cast<uint64_t*>(smem4);
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4) + bulk::kBarBytes;
  unsigned char* planes = base + kTiles * tile_bytes;
  auto* xe = reinterpret_cast<float2*>(planes + 3 * plane);
  float* part = reinterpret_cast<float*>(planes + 3 * plane + groups * 8);
  auto tile = [&](int m) { return RowTile<BITS, ST>{base + m * tile_bytes, row_bytes, srow, kTileRows}; };
  // Before the wait: the norm weights of this thread's first octet (the normalized form), thread 0's copies of the
  // block's tiles, and the router share's words, scales and norm weights (RES with a share; after the copies, which
  // would otherwise wait for a round trip of thread 0's loads).
  float nw[8];
  const int64_t o_mine = threadIdx.x;
  if constexpr (!RES) {
#pragma unroll
    for (int i = 0; i < 8; ++i) nw[i] = o_mine < n_oct ? load_float(a.f.norm_w, a.f.norm_type, o_mine * 8 + i) : 0.0f;
  }
  if (threadIdx.x == 0) mbar_init(bar, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect(bar, unsigned(kRows * (row_bytes + 2 * srow)));
#pragma unroll
    for (int m = 0; m < kTiles; ++m) bulk::issue_rows(pt.w, r0 + m * kTileRows, kTileRows, tile(m), bar);
  }
  constexpr bool share_on = SHARE > 0;
  static_assert(SHARE == 0 || (RES && kTiles == 1 && (SHARE == 16 || SHARE == 8)), "a share: 16 or 8 rows per part");
  static_assert(!ROUTE || SHARE > 0, "the route's words come from a share");
  ShareSmem share{};
  if constexpr (share_on) {
    share = share_smem(part + kWarps * kRows, a.f.share.w.out, kRows, a.f.share.w.bits);
    share_load(a.f.share, r0, kRows, share);
  }
  pdl_enter();
  if constexpr (ROUTE) {  // the previous layer's kernel B, which read them, has ended
    if (blockIdx.x == 0 && threadIdx.x < a.f.share.route.k) a.f.share.route.slots[threadIdx.x] = kRouteSlotEmpty;
  }
  // The residual rows come from earlier kernels: loaded as the wait returns, used at the end.
  float res = 0.0f;
  if (RES && a.f.residual && threadIdx.x < kRows) res = a.f.residual[r0 + threadIdx.x];
  const float* x = a.x;
  if constexpr (RES) {
    bulk::imma_stage<BITS, GS, 1>(
        in, [&](int64_t i, float(&v)[8]) { load8_global(x + i, true, v); }, planes, xe);
  } else {
    // rms_norm(x) * norm_w as the int8 operand: the sum of squares over the row, then the digits of each octet.
    float xv[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float ss = 0.0f;
    for (int64_t o = threadIdx.x; o < n_oct; o += kThreads) {
      float v[8];
      load8_global(x + o * 8, true, v);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        ss = fmaf(v[i], v[i], ss);
        if (o == o_mine) xv[i] = v[i];
      }
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(in) + a.f.eps);
    bulk::imma_stage<BITS, GS, 1>(
        in,
        [&](int64_t i, float(&v)[8]) {
          if (i == o_mine * 8) {
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = xv[j] * inv * nw[j];
          } else {
            load8_global(x + i, true, v);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = v[j] * inv * load_float(a.f.norm_w, a.f.norm_type, i + j);
          }
        },
        planes, xe);
  }
  __syncthreads();
  probe_mark(0);
  const unsigned char* bp = planes + (gid < 3 ? gid : 0) * plane + t * (GS / 4);
  const float lane_mul = bulk::imma_lane_mul(t);
  float acc[kTiles][2];
#pragma unroll
  for (int m = 0; m < kTiles; ++m) acc[m][0] = acc[m][1] = 0.0f;
  mbar_wait(bar, 0);
  probe_mark(1);
  constexpr int R = bulk::kRot<BITS, GS>;
  const int per = int(groups) / kWarps;
#pragma unroll
  for (int m = 0; m < kTiles; ++m) {
    const RowTile<BITS, ST> tm = tile(m);
    for (int g = warp * per; g < (warp + 1) * per; g += R) {
      bulk::tile_groups_imma<BITS, GS, ST, R>(tm, g, bp, g, xe, gid, t, lane_mul, acc[m]);
    }
  }
#pragma unroll
  for (int m = 0; m < kTiles; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) acc[m][h] += __shfl_xor_sync(0xffffffffu, acc[m][h], 1);
  }
  if (t == 0) {
#pragma unroll
    for (int m = 0; m < kTiles; ++m) {
      part[warp * kRows + m * kTileRows + gid] = acc[m][0];
      part[warp * kRows + m * kTileRows + gid + 8] = acc[m][1];
    }
  }
  __syncthreads();
  probe_mark(3);
  float ss = 0.0f;  // RES with a share: the sum of squares of this thread's row of y
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float s = part[r];
    for (int w2 = 1; w2 < kWarps; ++w2) s += part[w2 * kRows + r];
    if (RES && a.f.residual) s += res;
    pt.y[r0 + r] = s;
    if constexpr (share_on) {
      share.yn[r] = s * share.norm_w[r];
      ss = s * s;
    }
  }
  if constexpr (share_on) {
    // The block's rows are lanes 0-15 of warp 0: each part's squares added in a fixed tree.
    if (warp == 0) {
#pragma unroll
      for (int off = SHARE / 2; off >= 1; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
      if (lane < kRows && lane % SHARE == 0) share.ssq[lane / SHARE] = ss;
    }
    share_store_tile<SHARE, ROUTE>(a.f.share, share);
  }
  probe_mark(2);
}

// Launches gemv_bulk_imma_kernel over a's parts in blocks of `tiles` 16-row tiles; false (nothing launched) where a
// part is not whole blocks, the groups do not split evenly over the warps or shared memory is short.
bool launch_imma(const Ctx& ctx, GemvArgs& a, int tiles, bool res) {
  const WeightView& w = a.w[0];
  const int gs = int(w.group_size);
  if ((gs != 32 && gs != 64 && gs != 128) || w.in % gs != 0 || w.in % 8 != 0 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return false;
  }
  const int rows = tiles * kTileRows;
  int64_t blocks = 0;
  for (int i = 0; i < a.n_parts; ++i) {
    if (a.w[i].out % rows != 0) return false;
    blocks += a.w[i].out / rows;
    a.part_end[i] = unsigned(blocks);
  }
  const int64_t row_bytes = bulk::packed_row_bytes(w.in, w.bits), srow = bulk::scale_row_bytes_of(w);
  const int64_t groups = w.in / gs;
  const RouterShare& s = a.f.share;
  const size_t share_bytes = s.parts ? size_t(share_floats(s.w.out, rows, s.w.bits)) * 4 : 0;
  bool launched = false;
  dispatch(w, [&]<int BITS, int GS, typename ST>() {
    constexpr int kR = bulk::kRot<BITS, GS>;
    if (groups % (kWarps * kR) != 0) return;
    const size_t need = bulk::kBarBytes + size_t(tiles) * size_t(RowTile<BITS, ST>::bytes(kTileRows, row_bytes, srow)) +
                        size_t(bulk::imma_operand_bytes<GS>(w.in)) + size_t(kWarps) * rows * 4 + share_bytes;
    if (need > size_t(ctx.max_smem_optin)) return;
    const dim3 grid{unsigned(blocks)};
    if (res && !s.parts) {
      launch_k(ctx, gemv_bulk_imma_kernel<BITS, GS, ST, 1, true, 0>, grid, kThreads, need, a);
    } else if (res && s.rows == kTileRows && s.route.words) {
      launch_k(ctx, gemv_bulk_imma_kernel<BITS, GS, ST, 1, true, kTileRows, true>, grid, kThreads, need, a);
    } else if (res && s.rows == kTileRows) {
      launch_k(ctx, gemv_bulk_imma_kernel<BITS, GS, ST, 1, true, kTileRows>, grid, kThreads, need, a);
    } else if (res) {
      launch_k(ctx, gemv_bulk_imma_kernel<BITS, GS, ST, 1, true, kTileRows / 2>, grid, kThreads, need, a);
    } else if (tiles == 1) {
      launch_k(ctx, gemv_bulk_imma_kernel<BITS, GS, ST, 1, false, 0>, grid, kThreads, need, a);
    } else {
      launch_k(ctx, gemv_bulk_imma_kernel<BITS, GS, ST, 2, false, 0>, grid, kThreads, need, a);
    }
    launched = true;
  });
  return launched;
}

}  // namespace

bool launch_gemv_bulk_imma(const Ctx& ctx, GemvArgs& a) {
  if (ctx.gemv_imma == 0 || a.map.indices || !a.f.norm_w || a.f.xn_out || a.glu >= 0) return false;
  return launch_imma(ctx, a, ctx.gemv_imma, false);
}

bool launch_gemv_residual_imma(const Ctx& ctx, GemvArgs& a) {
  const WeightView& w = a.w[0];
  const RouterShare& s = a.f.share;
  // A share's parts of 16 or 8 rows (share_rows) within one of its groups: a tile's router columns are one group.
  const bool share_ok = !s.parts || ((s.rows == 16 || s.rows == 8) && s.w.group_size % kTileRows == 0);
  if (ctx.gemv_residual_imma == 0 || a.n_parts != 1 || a.map.indices || a.f.norm_w || a.f.xn_out || !a.f.residual ||
      a.f.router.k > 0 || a.glu >= 0 || w.n_stack != 1 || !share_ok || !bulk_weight_ok(ctx, w)) {
    return false;
  }
  return launch_imma(ctx, a, 1, true);
}

}  // namespace moecel::cuda::gemv
