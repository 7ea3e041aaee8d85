// The fused decode-MoE kernels A and B on tensor cores, fed by bulk copies like fused_moe_bulk.cu's (FusedMoeArgs::mma,
// MOECEL_CUDA_FUSED_MMA): each 16-row tile of weights is one m16n8k16 A operand and the vector (x, or the k act rows)
// the B operand in three bf16 terms (gemv_mma.cuh: centered codes, exact products, each group's MMAs folded with f32
// fmas). The CUDA-core loops spent ~3.5 instructions per weight and were issue-bound (kernel A) or latency-bound
// (kernel B) once their rows had landed; here unpacking costs ~1.5 per weight per lane group and the MMAs do the
// multiply-adds. Results agree with the CUDA-core kernels (and the gather path) to f32 rounding, not bit for bit.
// By default (FusedMoeArgs::imma) the vector is the int8 operand of bulk_imma.cuh instead: raw codes times fixed-point
// digits on int8 tensor cores, fewer instructions per weight still.
#include <algorithm>

#include "backend/cuda/bulk_imma.cuh"
#include "backend/cuda/fused_moe_bulk.cuh"
#include "backend/cuda/fused_moe_dot.cuh"
#include "backend/cuda/fused_route.cuh"
#include "backend/cuda/gemv_mma.cuh"

namespace moecel::cuda::bulk {
namespace {

// Kernel A's blocks per SM the register budget must allow: an OLMoE-sized grid (ffn 1024, 8 experts: 512 blocks)
// resident at once, as fused_gate_up_bulk_kernel's.
constexpr int kABlocksPerSm = 4;

// FusedMoeArgs::smem_fill. A block takes its dynamic and static shared memory, rounded up to the allocation unit, plus
// the per-block reservation: kernel B's one unit over half an SM and kernel A's one unit under a quarter leave room
// for B's block beside two of A's, so it starts as the second of them ends, not the third; four A blocks still leave
// no room for another kernel's.
constexpr int kSmemUnit = 128;

// The dynamic shared memory that makes `kernel`'s block take `footprint` bytes of an SM (at least `need`; `need` where
// that is past the opt-in limit or the SM's size is unknown).
template <class Kernel>
size_t filled_smem(const Ctx& ctx, Kernel kernel, size_t need, int footprint) {
  const int64_t stat = (int64_t(static_smem_bytes(kernel)) + kSmemUnit - 1) / kSmemUnit * kSmemUnit;
  const int64_t dyn = int64_t(footprint) - ctx.smem_reserved - stat;
  if (ctx.smem_per_sm <= 0 || dyn > ctx.max_smem_optin) return need;
  return std::max<size_t>(need, size_t(std::max<int64_t>(dyn, 0)));
}

// The vector operand and group loop of kernels A and B: bf16 planes one group at a time (tile_group_mma), bf16 planes
// R groups at a time (tile_groups_mma), or int8 digits R groups at a time (tile_groups_imma, R = kRot, maybe 1).
enum class Operand { kBf16, kBf16Rot, kInt8 };

// Bytes of shared memory of an n-value vector's operand: its planes, then per group its sum (bf16) or its sum and
// 2^-S_g (int8; float2, at an 8-byte aligned offset).
template <Operand OP, int GS>
constexpr int64_t operand_bytes(int64_t n) {
  return OP == Operand::kInt8 ? imma_operand_bytes<GS>(n) : 3 * mma_plane_bytes(n) + (n / GS + 3) / 4 * 16;
}

// Kernel B's vector: the k act rows as one vector of k * ffn values in three bf16 planes (plane stride
// mma_plane_bytes(k * ffn)) with its group sums, from act in global memory. All of a thread's loads are issued
// before its stores (kOct octets per thread in flight): a loop of load-then-store steps is a chain of L2 round trips.
template <int GS>
__device__ __forceinline__ void stage_act_planes(const float* act, int64_t n, unsigned char* planes, float* xsum) {
  constexpr int kOct = 4, kOctPerGroup = GS / 8, kShift = GS == 32 ? 5 : GS == 64 ? 6 : 7;
  const int64_t n_oct = n / 8, plane = mma_plane_bytes(n);
  const bool vec = (reinterpret_cast<uintptr_t>(act) & 15) == 0;
  for (int64_t o0 = 0; o0 < n_oct; o0 += int64_t(kThreads) * kOct) {  // uniform trip count: shuffles need every lane
    float v[kOct][8];
    load_octets<kOct>(
        o0, n_oct, [&](int64_t i, float(&w)[8]) { load8_global(act + i, vec, w); }, v);
#pragma unroll
    for (int u = 0; u < kOct; ++u) {
      const int64_t o = o0 + u * kThreads + threadIdx.x;
      if (o < n_oct) mma_put_octet(planes, plane, kShift, o * 8, v[u]);
      // A group's octets are kOctPerGroup consecutive lanes of one warp (o0 + u * kThreads is a multiple of 32).
      float s = octet_sum(v[u]);
#pragma unroll
      for (int off = 1; off < kOctPerGroup; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
      if (o < n_oct && o % kOctPerGroup == 0) xsum[o / kOctPerGroup] = s;
    }
  }
}

// Kernel A: the grid, copies and result of fused_gate_up_bulk_kernel with two rows per warp, i.e. a 16-row tile of
// gate and one of up rows per block. Warp w takes groups w, w + 8, ... of both tiles (with ROT, consecutive groups);
// the block adds the warps' partial sums in warp order. Shared memory: barriers, the gate tile, the up tile, x's three
// planes, x's group sums, the warps' partial sums. ROT: warp w takes groups [w, w + 1) * groups / kWarps, kRot at a
// time (tile_groups_mma; groups a multiple of kWarps * kRot), instead of groups w, w + 8, ... one at a time.
// ROUTE (int8 only): the router ranked by every block (FusedMoeArgs::route), x staged from y with its norm.
template <int BITS, int GS, typename ST, GluAct ACT, Operand OP, bool ROUTE = false>
__global__ void __launch_bounds__(kThreads, kABlocksPerSm)
    fused_gate_up_bulk_mma_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  constexpr int kRows = kMmaTileRows;  // rows of each matrix in this block
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, j = blockIdx.y;
  const int gid = lane >> 2, t = lane & 3;
  const int64_t ffn = a.gate.out, hidden = a.gate.in, groups = hidden / GS;
  const int64_t r0 = int64_t(blockIdx.x) * kRows;
  const int64_t row_bytes = packed_row_bytes(hidden, BITS), srow = scale_row_bytes<ST>(hidden, GS);
  constexpr bool kI8 = OP == Operand::kInt8;
  const int64_t tile_bytes = RowTile<BITS, ST>::bytes(kRows, row_bytes, srow);
  const int64_t plane = kI8 ? imma_plane_bytes<GS>(hidden) : mma_plane_bytes(hidden);
  auto* bars = reinterpret_cast<uint64_t*>(smem4);
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4) + kBarBytes;
  const RowTile<BITS, ST> tiles[2] = {{base, row_bytes, srow, kRows}, {base + tile_bytes, row_bytes, srow, kRows}};
  unsigned char* planes = base + 2 * tile_bytes;
  float* xsum = reinterpret_cast<float*>(planes + 3 * plane);  // bf16: group sums; int8: (sum, 2^-S) per group
  auto* xe = reinterpret_cast<float2*>(xsum);
  float* part = reinterpret_cast<float*>(planes + operand_bytes<OP, GS>(hidden));  // (kWarps, 2 * kRows)
  int32_t e;
  bool valid = true;
  if constexpr (ROUTE) {
    static_assert(kI8, "the route stages the int8 operand");
    __shared__ RouteSmem rs;
    const FusedRoute& rt = a.route;
    const int64_t o_mine = threadIdx.x, n_oct = hidden / 8;
    float nw[8], yv[8];  // this thread's octet: norm weights (before the wait) and y
#pragma unroll
    for (int i = 0; i < 8; ++i) nw[i] = o_mine < n_oct ? load_float(rt.norm_w, rt.norm_type, o_mine * 8 + i) : 0.0f;
    if (threadIdx.x < 2) mbar_init(&bars[threadIdx.x], 1);
    __syncthreads();
    pdl_wait();
    route_load(rt, hidden, yv, rs);
    pdl_trigger();  // every block has read the words once kernel B starts: its block 0 may zero them
    // The fixed-point sums rank as the logits do (the norm's factor is positive and finite where no part raised the
    // flag), so the gate rows go out before the factor's block sum; the fallback ranks the logits themselves.
    const bool flagged = rs.flagged;
    float inv = flagged ? route_inv(rt, hidden, yv, rs) : 0.0f;
    if (flagged) route_fallback(rt, inv, rs);
    route_rank(rt.n_experts, a.k, rs);
    e = rs.sel[j];
    if (threadIdx.x == 0) {
      const unsigned bytes = unsigned(kRows * (row_bytes + 2 * srow));
      mbar_arrive_expect(&bars[0], bytes);
      issue_rows(a.gate, int64_t(e) * ffn + r0, kRows, tiles[0], &bars[0]);
    }
    if (!flagged) inv = route_inv(rt, hidden, yv, rs);
    if (blockIdx.x == 0 && j == 0 && threadIdx.x < 32) route_publish(rt, a.k, inv, rt.indices, rt.weights, rs);
    // As gemv_bulk_imma_kernel's normalized staging (kept apart: q/k/v's code stays as measured).
    imma_stage<BITS, GS, 1>(
        hidden,
        [&](int64_t i, float(&v)[8]) {
          if (i == o_mine * 8) {
#pragma unroll
            for (int q = 0; q < 8; ++q) v[q] = yv[q] * inv * nw[q];
          } else {
            load8_global(rt.y + i, true, v);
#pragma unroll
            for (int q = 0; q < 8; ++q) v[q] = v[q] * inv * load_float(rt.norm_w, rt.norm_type, i + q);
          }
        },
        planes, xe);
  } else {
    valid = gate_up_prologue(a, j, r0, kRows, tiles[0], tiles[1], &bars[0], e, true);
    auto load = [&](int64_t i, float(&v)[8]) { load8_global(a.x + i, true, v); };
    if constexpr (kI8) {
      imma_stage<BITS, GS, 1>(hidden, load, planes, xe);
    } else {
      mma_stage<GS>(hidden, load, planes, xsum);
    }
  }
  __syncthreads();
  probe_mark(0);
  if (!valid) {  // uniform over the block; no barrier follows
    if (threadIdx.x == 0) raise_device_error(err, kErrExpertIndex);
    if (threadIdx.x < kRows) a.act[j * ffn + r0 + threadIdx.x] = __int_as_float(0x7fc00000);
    return;
  }
  // Lane (gid, t) loads x's B fragments from plane gid (hi, mid, lo or digits 0-2; the other lanes hold zero columns).
  const unsigned char* bp = planes + (gid < 3 ? gid : 0) * plane + t * (kI8 ? GS / 4 : 16);
  const float lane_mul = imma_lane_mul(t);
  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [tile][row gid, row gid + 8]
  // The gate tile as soon as it lands (thread 0 then issues up's copies), then the up tile (thread 0 then requests its
  // share of kernel B's rows into L2): each row's sums in group order.
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    mbar_wait(&bars[m], 0);
    probe_mark(1 + m);
    if (m == 0 && threadIdx.x == 0) issue_up(a, e, r0, kRows, tiles[1], &bars[0]);
    if (m == 1 && a.l2_down && threadIdx.x == 0) prefetch_down_share(a, e);
    if constexpr (OP != Operand::kBf16) {
      constexpr int R = kRot<BITS, GS>;
      const int per = int(groups) / kWarps;
      for (int g = warp * per; g < (warp + 1) * per; g += R) {
        if constexpr (kI8) {
          tile_groups_imma<BITS, GS, ST, R>(tiles[m], g, bp, g, xe, gid, t, lane_mul, acc[m]);
        } else {
          tile_groups_mma<BITS, GS, ST, R>(tiles[m], g, bp, g, xsum, gid, t, acc[m]);
        }
      }
    } else {
#pragma unroll 2  // the groups' loads and MMAs are independent (only the folds into acc are ordered)
      for (int64_t g = warp; g < groups; g += kWarps) {
        const float xs = t == 0 ? xsum[g] : 0.0f;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile_group_mma<BITS, GS>(tiles[m].base, row_bytes, g, bp, g, gid, t, d);
        fold_group(tiles[m], g, xs, gid, d, acc[m]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < 2; ++m) {
#pragma unroll
    for (int h = 0; h < 2; ++h) acc[m][h] += __shfl_xor_sync(0xffffffffu, acc[m][h], 1);
  }
  if (t == 0) {
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      part[warp * 2 * kRows + m * kRows + gid] = acc[m][0];
      part[warp * 2 * kRows + m * kRows + gid + 8] = acc[m][1];
    }
  }
  __syncthreads();
  if (threadIdx.x < kRows) {  // row r's gate and up: the warps' partial sums in warp order
    const int r = threadIdx.x;
    float gsum = part[r], usum = part[kRows + r];
    for (int w2 = 1; w2 < kWarps; ++w2) {
      gsum += part[w2 * 2 * kRows + r];
      usum += part[w2 * 2 * kRows + kRows + r];
    }
    a.act[j * ffn + r0 + r] = glu_value<ACT>(gsum, usum);
  }
  probe_mark(3);
}

// Kernel B: grid (hidden / 16, or the SMs' count with FusedMoeArgs::smem_fill), a 16-row tile of down rows for each of
// the k slots per block, every slot's copies issued before the wait for kernel A (as fused_down_bulk_kernel's). Warp w
// computes slots w, w + 8, ... (each its tile times that slot's act row); the block adds the slots in order: out[r] =
// (residual[r] +) sum_j weights[j] * (down[e_j][r] . act[j]). Shared memory: barriers, k tiles, the act planes, their
// group sums, the slots' sums. ROT: whole rounds of kRot groups (groups a multiple of it), else one group at a time: a
// variant each, so that neither carries the other's loop. ROUTE: the experts and weights from the route's slots
// (route_poll), and block 0 zeroes the route's words.
template <int BITS, int GS, typename ST, Operand OP, bool ROUTE = false>
__global__ void __launch_bounds__(kThreads) fused_down_bulk_mma_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  constexpr int kRows = kMmaTileRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
  const int64_t hidden = a.down.out, ffn = a.down.in, groups = ffn / GS, r0 = int64_t(blockIdx.x) * kRows;
  const int64_t row_bytes = packed_row_bytes(ffn, BITS), srow = scale_row_bytes<ST>(ffn, GS);
  constexpr bool kI8 = OP == Operand::kInt8;
  const int64_t tile_bytes = RowTile<BITS, ST>::bytes(kRows, row_bytes, srow), n = a.k * ffn;
  const int64_t plane = kI8 ? imma_plane_bytes<GS>(n) : mma_plane_bytes(n);
  auto* bars = reinterpret_cast<uint64_t*>(smem4);
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4) + kBarBytes;
  auto tile = [&](int sl) { return RowTile<BITS, ST>{base + sl * tile_bytes, row_bytes, srow, kRows}; };
  unsigned char* planes = base + a.k * tile_bytes;
  float* xsum = reinterpret_cast<float*>(planes + 3 * plane);  // (k * groups): bf16 sums; int8 (sum, 2^-S) pairs
  auto* xe = reinterpret_cast<float2*>(xsum);
  float* part = reinterpret_cast<float*>(planes + operand_bytes<OP, GS>(n));  // (k, kRows)
  __shared__ int32_t experts[kMaxSlots];
  __shared__ float slot_weights[kMaxSlots];
  if (a.b_early) pdl_trigger();
  if (r0 >= hidden) {  // a block past the tiles (launch_down_bulk_mma) holds its SM until kernel A has ended
    pdl_wait();
    return;
  }
  if (threadIdx.x == 0) {
    for (int sl = 0; sl < a.k; ++sl) mbar_init(&bars[sl], 1);
    if constexpr (ROUTE) route_poll(a.route, a.k, experts, slot_weights);
  }
  if constexpr (ROUTE) {  // every kernel A block read the words before kernel B could start
    if (blockIdx.x == 0 && threadIdx.x <= a.route.n_experts) a.route.words[threadIdx.x] = 0ull;
  }
  __syncthreads();
  // Before the wait for kernel A: the indices and weights come from the kernel before it (see fused_down_bulk_kernel),
  // or from the route's slots.
  if (threadIdx.x < a.k) {
    const int sl = threadIdx.x;
    int32_t e;
    if constexpr (ROUTE) {
      e = experts[sl];
    } else {
      e = __ldcg(a.indices + sl);
      slot_weights[sl] = __ldcg(a.weights + sl);
      experts[sl] = e;
    }
    const bool ok = valid_expert(e, a.down.n_stack);
    mbar_arrive_expect(&bars[sl], ok ? unsigned(kRows * (row_bytes + 2 * srow)) : 0u);
    if (ok) issue_rows(a.down, int64_t(e) * hidden + r0, kRows, tile(sl), &bars[sl]);
  }
  const float res = a.residual && threadIdx.x < kRows ? __ldcg(a.residual + r0 + threadIdx.x) : 0.0f;
  pdl_enter();
  if constexpr (kI8) {
    const bool vec = (reinterpret_cast<uintptr_t>(a.act) & 15) == 0;
    auto load = [&](int64_t i, float(&v)[8]) { load8_global(a.act + i, vec, v); };
    imma_stage<BITS, GS, 4>(n, load, planes, xe);
  } else {
    stage_act_planes<GS>(a.act, n, planes, xsum);
  }
  __syncthreads();
  probe_mark(0);
  const unsigned char* bp = planes + (gid < 3 ? gid : 0) * plane + t * (kI8 ? GS / 4 : 16);
  const float lane_mul = imma_lane_mul(t);
  for (int sl = warp; sl < a.k; sl += kWarps) {
    if (!valid_expert(experts[sl], a.down.n_stack)) continue;  // its sum is never read
    const RowTile<BITS, ST> tl = tile(sl);
    mbar_wait(&bars[sl], 0);
    if (sl == 0) probe_mark(1);
    float acc[2] = {0.0f, 0.0f};
    if constexpr (kI8) {  // whole rounds of R groups (aligned scale loads): the same sums in order
      constexpr int R = kRot<BITS, GS>;
      const int ng = int(groups), g0 = sl * ng;
      const ImmaLane<BITS, GS, ST, R> il(tl, gid, t);
      for (int gl = 0; gl < ng; gl += R) {
        tile_groups_imma<BITS, GS, ST, R>(tl, il, gl, bp, g0 + gl, xe, gid, t, lane_mul, acc);
      }
    } else if constexpr (OP == Operand::kBf16Rot) {
      constexpr int R = kRot<BITS, GS>;
      for (int64_t gl = 0; gl < groups; gl += R) {
        tile_groups_mma<BITS, GS, ST, R>(tl, int(gl), bp, int(sl * groups + gl), xsum, gid, t, acc);
      }
    } else {
#pragma unroll 4  // as kernel A's group loop: several groups' MMA chains in flight per warp
      for (int64_t gl = 0; gl < groups; ++gl) {
        const int64_t g = sl * groups + gl;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        tile_group_mma<BITS, GS>(tl.base, row_bytes, gl, bp, g, gid, t, d);
        fold_group(tl, gl, t == 0 ? xsum[g] : 0.0f, gid, d, acc);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) acc[h] += __shfl_xor_sync(0xffffffffu, acc[h], 1);
    if (t == 0) {
      part[sl * kRows + gid] = acc[0];
      part[sl * kRows + gid + 8] = acc[1];
    }
  }
  probe_mark(2);
  __syncthreads();
  if (threadIdx.x < kRows) {
    const int r = threadIdx.x;
    float out = 0.0f;
    for (int sl = 0; sl < a.k; ++sl) {
      if (!valid_expert(experts[sl], a.down.n_stack)) {
        if (r == 0 && blockIdx.x == 0) raise_device_error(err, kErrExpertIndex);
        out = __int_as_float(0x7fc00000);
      } else {
        out = fmaf(slot_weights[sl], part[sl * kRows + r], out);  // the gather path's weighted sum, same order
      }
    }
    a.out[r0 + r] = a.residual ? res + out : out;
  }
  probe_mark(3);
}

}  // namespace

// The tensor-core kernel A for 4-/8-bit experts with group size 32, 64 or 128 and ffn a multiple of its 16-row tiles;
// false (launching nothing) otherwise. The int8 operand where a.imma and its group loop applies (groups a multiple of
// kWarps * kRot), else bf16.
bool launch_gate_up_bulk_mma(const Ctx& ctx, const FusedMoeArgs& a, bool dry) {
  const WeightView& g = a.gate;
  const int gs = int(g.group_size);
  // x 16-byte aligned (the allocator's buffers are): the kernel has no scalar path for it (which cost it a spill).
  if (g.out % kMmaTileRows != 0 || (gs != 32 && gs != 64 && gs != 128) || g.in % gs != 0 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return false;
  }
  const int64_t row_bytes = packed_row_bytes(g.in, g.bits), srow = scale_row_bytes_of(g);
  const int64_t groups = g.in / gs;
  const dim3 grid{unsigned(g.out / kMmaTileRows), unsigned(a.k)};
  const bool routed = a.route.words != nullptr;
  const FusedMoeArgs as = with_down_share(a, grid.x);
  bool launched = false;
  dispatch(g, [&]<int BITS, int GS, typename ST>() {
    constexpr int kR = kRot<BITS, GS>;
    const bool whole = groups % (kWarps * kR) == 0;
    const Operand op = a.imma && whole               ? Operand::kInt8
                       : kR > 1 && a.rotate && whole ? Operand::kBf16Rot
                                                     : Operand::kBf16;
    const int64_t vec =
        op == Operand::kInt8 ? operand_bytes<Operand::kInt8, GS>(g.in) : operand_bytes<Operand::kBf16, GS>(g.in);
    const size_t need = kBarBytes + 2 * size_t((kMmaTileRows * (row_bytes + 2 * srow) + 15) / 16 * 16) + size_t(vec) +
                        size_t(kWarps) * 2 * kMmaTileRows * sizeof(float);
    // The route's RouteSmem is static shared memory: beside the dynamic part, within the opt-in limit.
    const size_t route_static = routed ? sizeof(RouteSmem) : 0;
    if (need + route_static > size_t(ctx.max_smem_optin) || (routed && op != Operand::kInt8)) return;
    if (dry) {
      launched = true;
      return;
    }
    auto run = [&](auto kernel) {  // kABlocksPerSm blocks (less one allocation unit each) fill an SM
      const size_t smem =
          a.smem_fill ? filled_smem(ctx, kernel, need, ctx.smem_per_sm / kABlocksPerSm - kSmemUnit) : need;
      launch_bulk(ctx, kernel, grid, smem, as);
    };
    auto go = [&]<GluAct ACT>() {
      if (routed) return run(fused_gate_up_bulk_mma_kernel<BITS, GS, ST, ACT, Operand::kInt8, true>);
      if (op == Operand::kInt8) return run(fused_gate_up_bulk_mma_kernel<BITS, GS, ST, ACT, Operand::kInt8>);
      if constexpr (kR > 1) {
        if (op == Operand::kBf16Rot) return run(fused_gate_up_bulk_mma_kernel<BITS, GS, ST, ACT, Operand::kBf16Rot>);
      }
      run(fused_gate_up_bulk_mma_kernel<BITS, GS, ST, ACT, Operand::kBf16>);
    };
    switch (a.glu) {
      case GluAct::kSiLU: go.template operator()<GluAct::kSiLU>(); break;
      case GluAct::kGeLU: go.template operator()<GluAct::kGeLU>(); break;
      case GluAct::kReLU2: go.template operator()<GluAct::kReLU2>(); break;
    }
    launched = true;
  });
  return launched;
}

// The tensor-core kernel B for 4-/8-bit experts with group size 32, 64 or 128, hidden a multiple of its 16-row tiles
// and up to kMaxSlots selected experts; false (launching nothing) otherwise. The int8 operand where a.imma and its
// group loop applies (groups a multiple of kRot), else bf16.
bool launch_down_bulk_mma(const Ctx& ctx, const FusedMoeArgs& a, bool dry) {
  const WeightView& d = a.down;
  const int gs = int(d.group_size);
  if (d.out % kMmaTileRows != 0 || (gs != 32 && gs != 64 && gs != 128) || d.in % gs != 0 || a.k > kMaxSlots) {
    return false;
  }
  const int64_t row_bytes = packed_row_bytes(d.in, d.bits), srow = scale_row_bytes_of(d);
  const int64_t groups = d.in / gs, n = a.k * d.in;
  const dim3 grid{unsigned(d.out / kMmaTileRows)};
  const bool routed = a.route.words != nullptr;
  bool launched = false;
  dispatch(d, [&]<int BITS, int GS, typename ST>() {
    constexpr int kR = kRot<BITS, GS>;
    const bool whole = groups % kR == 0;
    const Operand op = a.imma && whole               ? Operand::kInt8
                       : kR > 1 && a.rotate && whole ? Operand::kBf16Rot
                                                     : Operand::kBf16;
    const int64_t vec =
        op == Operand::kInt8 ? operand_bytes<Operand::kInt8, GS>(n) : operand_bytes<Operand::kBf16, GS>(n);
    const size_t need = kBarBytes + size_t(a.k) * size_t((kMmaTileRows * (row_bytes + 2 * srow) + 15) / 16 * 16) +
                        size_t(vec) + size_t(a.k) * kMmaTileRows * sizeof(float);
    if (need > size_t(ctx.max_smem_optin) || (routed && op != Operand::kInt8)) return;
    launched = true;
    if (dry) return;
    // One allocation unit over half an SM: no room for a second block. With that, a block on every SM (those past
    // the tiles only wait): an SM without one took four q/k/v blocks instead of three, and the last of them to
    // arrive staged its vector ~2 us after the others (cause not found); +0.4% with it (docs/benchmarks.md,
    // thirty-first tree).
    auto run = [&](auto kernel) {
      const bool fill = a.smem_fill && grid.x <= unsigned(ctx.sm_count);
      const dim3 g{fill ? unsigned(ctx.sm_count) : grid.x};
      launch_bulk(ctx, kernel, g, fill ? filled_smem(ctx, kernel, need, ctx.smem_per_sm / 2 + kSmemUnit) : need, a);
    };
    if (routed) return run(fused_down_bulk_mma_kernel<BITS, GS, ST, Operand::kInt8, true>);
    if (op == Operand::kInt8) return run(fused_down_bulk_mma_kernel<BITS, GS, ST, Operand::kInt8>);
    if constexpr (kR > 1) {
      if (op == Operand::kBf16Rot) return run(fused_down_bulk_mma_kernel<BITS, GS, ST, Operand::kBf16Rot>);
    }
    run(fused_down_bulk_mma_kernel<BITS, GS, ST, Operand::kBf16>);
  });
  return launched;
}

}  // namespace moecel::cuda::bulk

namespace moecel::cuda {

bool launch_fused_moe_routed(const Ctx& ctx, const FusedMoeArgs& a, bool dry) {
  using namespace bulk;
  const FusedRoute& r = a.route;
  const WeightView &g = a.gate, &d = a.down;
  // One octet of y per thread stays in registers (route_load); the rest are loaded again while staging.
  if (!r.words || !r.slots || !r.y || !r.indices || !r.weights || r.n_experts < 1 || r.n_experts > kRouteMaxExperts ||
      g.n_stack != r.n_experts || a.k < 1 || a.k > kMaxSlots || a.k > r.n_experts || !a.imma || !a.bulk || a.mma == 0 ||
      g.in % 8 != 0 || reinterpret_cast<uintptr_t>(r.y) % 16 != 0 || !bulk_rows_ok(g) || !bulk_rows_ok(a.up) ||
      !bulk_rows_ok(d)) {
    return false;
  }
  FusedMoeArgs as = a;
  as.x = r.y;  // launch_gate_up_bulk_mma's alignment test
  if (!launch_gate_up_bulk_mma(ctx, as, true) || !launch_down_bulk_mma(ctx, as, true)) return false;
  if (dry) return true;
  launch_gate_up_bulk_mma(ctx, as, false);
  launch_down_bulk_mma(ctx, as, false);
  return true;
}

}  // namespace moecel::cuda
