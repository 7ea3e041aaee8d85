// The streaming matrix-vector kernel for one large single-token product (the vocabulary projection, after the final
// RMSNorm): one block per SM walks a contiguous run of 32-row tiles through a ring of shared-memory slots fed by
// bulk copies, so the normalized x is staged once per block (not once per 16 rows, as gemv_bulk_kernel's thousands of
// blocks do) and the ring keeps DRAM busy while the warps compute. The CUDA-core kernel's per-row arithmetic (staging,
// normalization, chunk sums, the lane order of the dot product) is gemv_bulk_kernel's, so its logits are bit for bit
// the same; the tensor-core kernel (the default where the shape allows) agrees with them to its operand's rounding.
#include <algorithm>

#include "backend/cuda/bulk_imma.cuh"
#include "backend/cuda/bulk_mma.cuh"
#include "backend/cuda/fused_moe_bulk.cuh"
#include "backend/cuda/fused_moe_dot.cuh"
#include "backend/cuda/qgemv.cuh"

namespace moecel::cuda {
namespace {

using gemv::GemvArgs;
using gemv::kThreads;
constexpr int kWarps = gemv::kWarps;
constexpr int kRpw = 4;               // rows per warp and tile
constexpr int kRows = kWarps * kRpw;  // rows per tile
constexpr int kMaxSlots = 8;          // barriers in the block's first kBarBytes
static_assert(kMaxSlots * 8 <= int(bulk::kBarBytes), "the slots' barriers fit before the ring");

// A streaming block's start: the norm weight's loads, the slots' barriers, the first slots' copies (issue(tile, slot)
// by thread 0; weights only, so before the wait), then x staged and, with a norm, normalized (ends with a barrier
// either way).
template <class Issue>
__device__ __forceinline__ void stream_prologue(const GemvArgs& a, int slots, int64_t t0, int64_t t1, uint64_t* bar,
                                                float* xs, Issue issue) {
  const int64_t in = a.w[0].in;
  uint32_t nraw[gemv::kNormRegs];
  gemv::load_norm_raw(a, in, nraw);  // before the barrier: ahead of thread 0's copies
  if (threadIdx.x < slots) mbar_init(bar + threadIdx.x, 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int s = 0; s < slots && t0 + s < t1; ++s) issue(t0 + s, s);
  }
  float nw[gemv::kNormRegs];
  gemv::convert_norm(a, nraw, nw);
  pdl_enter();
  if (a.f.norm_w) {
    gemv::stage_normalized(a, in, 0, a.x, xs, nw);
  } else {
    stage_chunks(a.x, in, xs);
    __syncthreads();
  }
}

// The argmax tail (ArgmaxTail): every thread passes the best (value, index) of the outputs it wrote (index -1:
// none); block b's best goes to the partials, and the last block to take a ticket reduces them all.
__device__ __forceinline__ void stream_argmax_tail(const ArgmaxTail& t, float v, int i) {
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ bool last;
  block_argmax(v, i, red_v, red_i);
  if (threadIdx.x == 0) {
    t.part_v[blockIdx.x] = v;
    t.part_i[blockIdx.x] = i;
    __threadfence();
    last = atomicAdd(t.counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  block_argmax_partials(t.part_v, t.part_i, int(gridDim.x), red_v, red_i, v, i);
  if (threadIdx.x == 0) {
    publish_argmax(i, t.out, t.advance, t.host_out);
    *t.counter = 0u;
  }
}

// Grid (resident blocks): block b takes tiles [b * n_tiles / G, (b + 1) * n_tiles / G) of a.w[0] (one part; y[0]).
// Shared memory: the slots' barriers, `slots` tiles of kRows rows (RowTile layout), x staged. Tile i of the block sits
// in slot i % slots; thread 0 refills a slot once every warp is done with it. Preconditions (launch_gemv_stream):
// one part, bulk_rows_ok, in % 32 == 0.
template <int BITS, typename ST>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_kernel(GemvArgs a, int slots, int64_t n_tiles, ArgmaxTail tail) {
  extern __shared__ float4 smem4[];
  const WeightView& w = a.w[0];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t in = w.in, out = w.out, n_chunks = in / kChunk;
  const int64_t row_bytes = bulk::packed_row_bytes(in, BITS), srow = bulk::scale_row_bytes<ST>(in, w.group_size);
  const int64_t tile_bytes = bulk::RowTile<BITS, ST>::bytes(kRows, row_bytes, srow);
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  unsigned char* ring = smem + bulk::kBarBytes;
  float* xs = reinterpret_cast<float*>(ring + slots * tile_bytes);
  const int64_t t0 = int64_t(blockIdx.x) * n_tiles / gridDim.x, t1 = int64_t(blockIdx.x + 1) * n_tiles / gridDim.x;
  // Slot s's tile; a short last tile fills its first rows (the layout stays kRows rows).
  auto slot = [&](int s) { return bulk::RowTile<BITS, ST>{ring + s * tile_bytes, row_bytes, srow, kRows}; };
  auto issue = [&](int64_t t, int s) {  // thread 0
    const int n = int(bulk::min64(kRows, out - t * kRows));
    mbar_arrive_expect(bar + s, unsigned(n * (row_bytes + 2 * srow)));
    bulk::issue_rows(w, t * kRows, n, slot(s), bar + s);
  };
  stream_prologue(a, slots, t0, t1, bar, xs, issue);
  stage_xsums(xs, n_chunks);
  __syncthreads();
  const int gshift = __ffs(w.group_size / kChunk) - 1;
  float best_v = 0.0f;  // the argmax tail's: lane 0's rows
  int best_i = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const int i = int(t - t0), s = i % slots;
    const int64_t r0 = t * kRows;
    const int n_rows = int(bulk::min64(kRows, out - r0));
    const bulk::RowTile<BITS, ST> tile = slot(s);
    mbar_wait(bar + s, unsigned(i / slots) & 1u);
    int lr[kRpw];  // the warp's rows in the tile (past the end: the last row, its result dropped)
#pragma unroll
    for (int k = 0; k < kRpw; ++k) lr[k] = min(warp * kRpw + k, n_rows - 1);
    float acc[kRpw];
#pragma unroll
    for (int k = 0; k < kRpw; ++k) acc[k] = 0.0f;
    bulk::tile_rows_dot(tile, lr, int(n_chunks), gshift, xs, lane, acc);
#pragma unroll
    for (int k = 0; k < kRpw; ++k) acc[k] = warp_sum(acc[k]);
    if (lane == 0) {
#pragma unroll
      for (int k = 0; k < kRpw; ++k) {
        if (warp * kRpw + k < n_rows) {
          const int64_t r = r0 + warp * kRpw + k;
          a.y[0][r] = acc[k];
          if (arg_better(acc[k], int(r), best_v, best_i)) best_v = acc[k], best_i = int(r);
        }
      }
    }
    __syncthreads();  // every warp is done with slot s
    if (threadIdx.x == 0 && t + slots < t1) issue(t + slots, s);
  }
  if (tail.out) stream_argmax_tail(tail, best_v, best_i);
}

// One launch of a streaming kernel over as many blocks as are resident at once (at most one per tile).
template <class Kernel>
void launch_resident(const Ctx& ctx, Kernel kernel, const GemvArgs& a, size_t smem, int slots, int64_t n_tiles,
                     const ArgmaxTail& tail) {
  const int64_t resident = int64_t(resident_per_sm(kernel, kThreads, smem)) * std::max(ctx.sm_count, 1);
  const dim3 grid{unsigned(std::min(n_tiles, std::max<int64_t>(1, resident)))};
  CUDA_REQUIRE(!tail.out || int64_t(grid.x) <= tail.max_parts, "gemv: more blocks than argmax partials");
  launch_k(ctx, kernel, grid, kThreads, smem, a, slots, n_tiles, tail);
}

template <int BITS>
void launch_bits(const Ctx& ctx, const GemvArgs& a, size_t smem, int slots, int64_t n_tiles, const ArgmaxTail& tail) {
  auto go = [&](auto kernel) { launch_resident(ctx, kernel, a, smem, slots, n_tiles, tail); };
  switch (a.w[0].stype) {
    case FloatType::kF32: go(gemv_stream_kernel<BITS, float>); break;
    case FloatType::kF16: go(gemv_stream_kernel<BITS, __half>); break;
    case FloatType::kBF16: go(gemv_stream_kernel<BITS, __nv_bfloat16>); break;
  }
}

// The same walk on tensor cores (MOECEL_CUDA_GEMV_STREAM_MMA): a slot holds a 32-row tile as two 16-row RowTiles (the
// layout bulk::tile_groups_mma reads), x staged and normalized as above and then as three bf16 planes; warp w takes
// 16-row half w % 2 and a quarter of its groups, the quarters' sums added in order by 32 threads. The CUDA-core loop
// above is issue-bound at ~3.5 instructions per weight; unpacking for the MMAs costs ~1.5. The logits agree with it
// to f32 rounding, not bit for bit. Preconditions (launch_gemv_stream): out % kRows == 0, groups % (4 * kRot) == 0.
// I8 (the default, Ctx::gemv_stream_mma == 1): x as kernel A's int8 operand (bulk_imma.cuh) and its group loop, fewer
// instructions per weight than the bf16 planes' (as q/k/v and the o projection, thirty-fourth and thirty-fifth trees).
constexpr int kQuarters = kWarps / 2;
template <int BITS, int GS, typename ST, bool I8>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_mma_kernel(GemvArgs a, int slots, int64_t n_tiles, ArgmaxTail tail) {
  extern __shared__ float4 smem4[];
  constexpr int kHalf = kMmaTileRows, R = bulk::kRot<BITS, GS>;
  const WeightView& w = a.w[0];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, t = lane & 3;
  const int64_t in = w.in, n_chunks = in / kChunk, groups = in / GS;
  const int64_t plane = I8 ? bulk::imma_plane_bytes<GS>(in) : mma_plane_bytes(in);
  const int64_t row_bytes = bulk::packed_row_bytes(in, BITS), srow = bulk::scale_row_bytes<ST>(in, GS);
  const int64_t half_bytes = bulk::RowTile<BITS, ST>::bytes(kHalf, row_bytes, srow);
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  unsigned char* ring = smem + bulk::kBarBytes;
  float* xs = reinterpret_cast<float*>(ring + slots * 2 * half_bytes);
  unsigned char* planes = reinterpret_cast<unsigned char*>(xs + n_chunks * kChunkPad);
  float* xsum = reinterpret_cast<float*>(planes + 3 * plane);  // bf16: group sums; int8: (sum, 2^-S) pairs
  auto* xe = reinterpret_cast<float2*>(xsum);
  float* part = xsum + (I8 ? 2 * groups : (groups + 3) / 4 * 4);  // two buffers of (kWarps, kHalf)
  const int64_t t0 = int64_t(blockIdx.x) * n_tiles / gridDim.x, t1 = int64_t(blockIdx.x + 1) * n_tiles / gridDim.x;
  auto half = [&](int s, int h) {
    return bulk::RowTile<BITS, ST>{ring + (2 * s + h) * half_bytes, row_bytes, srow, kHalf};
  };
  auto issue = [&](int64_t tile, int s) {  // thread 0
    mbar_arrive_expect(bar + s, unsigned(kRows * (row_bytes + 2 * srow)));
    for (int h = 0; h < 2; ++h) bulk::issue_rows(w, tile * kRows + h * kHalf, kHalf, half(s, h), bar + s);
  };
  stream_prologue(a, slots, t0, t1, bar, xs, issue);
  if constexpr (I8) {
    bulk::imma_stage<BITS, GS, 1>(
        in,
        [&](int64_t i, float(&v)[8]) {
          const float* src = xs + (i / kChunk) * kChunkPad + i % kChunk;
          const float4 lo = reinterpret_cast<const float4*>(src)[0], hi = reinterpret_cast<const float4*>(src)[1];
          v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
        },
        planes, xe);
  } else {
    mma_stage_chunks<GS>(in, xs, planes, xsum);
  }
  __syncthreads();
  const unsigned char* bp = planes + (gid < 3 ? gid : 0) * plane + t * (I8 ? GS / 4 : 16);
  const float lane_mul = bulk::imma_lane_mul(t);
  const int h = warp & 1, per = int(groups) / kQuarters, g0 = (warp >> 1) * per;
  float best_v = 0.0f;  // the argmax tail's: row threadIdx.x of every tile
  int best_i = -1;
  for (int64_t tile = t0; tile < t1; ++tile) {
    const int i = int(tile - t0), s = i % slots;
    mbar_wait(bar + s, unsigned(i / slots) & 1u);
    const bulk::RowTile<BITS, ST> tl = half(s, h);
    float acc[2] = {0.0f, 0.0f};  // rows gid, gid + 8 of the half
    for (int g = g0; g < g0 + per; g += R) {
      if constexpr (I8) {
        bulk::tile_groups_imma<BITS, GS, ST, R>(tl, g, bp, g, xe, gid, t, lane_mul, acc);
      } else {
        bulk::tile_groups_mma<BITS, GS, ST, R>(tl, g, bp, g, xsum, gid, t, acc);
      }
    }
#pragma unroll
    for (int k = 0; k < 2; ++k) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], 1);
    float* pb = part + (i & 1) * kWarps * kHalf;  // double-buffered: the next tile's writes need no second barrier
    if (t == 0) {
      pb[warp * kHalf + gid] = acc[0];
      pb[warp * kHalf + gid + 8] = acc[1];
    }
    __syncthreads();  // every warp is done with slot s and has written its sums
    if (threadIdx.x == 0 && tile + slots < t1) issue(tile + slots, s);
    if (threadIdx.x < kRows) {  // row r: its half's quarters in order
      const int r = threadIdx.x, rh = r / kHalf, rr = r % kHalf;
      float y = pb[rh * kHalf + rr];
      for (int q = 1; q < kQuarters; ++q) y += pb[(2 * q + rh) * kHalf + rr];
      a.y[0][tile * kRows + r] = y;
      if (arg_better(y, int(tile * kRows + r), best_v, best_i)) best_v = y, best_i = int(tile * kRows + r);
    }
  }
  if (tail.out) stream_argmax_tail(tail, best_v, best_i);
}

// Launches the walk with x's operand I8 (int8) or bf16; false, launching nothing, where its shared memory does not fit.
template <int BITS, int GS, bool I8>
bool launch_mma_gs(const Ctx& ctx, const GemvArgs& a, int slots, int64_t n_tiles, const ArgmaxTail& tail) {
  const WeightView& w = a.w[0];
  const int64_t groups = w.in / GS;
  const int64_t row_bytes = bulk::packed_row_bytes(w.in, BITS), srow = bulk::scale_row_bytes_of(w);
  const int64_t vec = I8 ? bulk::imma_operand_bytes<GS>(w.in)
                         : 3 * mma_plane_bytes(w.in) + (groups + 3) / 4 * 4 * int64_t(sizeof(float));
  const size_t smem = bulk::kBarBytes +
                      size_t(slots) * 2 * size_t(bulk::RowTile<4, float>::bytes(kMmaTileRows, row_bytes, srow)) +
                      bulk::staged_floats_bytes(w.in) + size_t(vec) + 2 * size_t(kWarps) * kMmaTileRows * sizeof(float);
  if (smem > size_t(ctx.max_smem_optin)) return false;
  auto go = [&](auto kernel) { launch_resident(ctx, kernel, a, smem, slots, n_tiles, tail); };
  switch (w.stype) {
    case FloatType::kF32: go(gemv_stream_mma_kernel<BITS, GS, float, I8>); break;
    case FloatType::kF16: go(gemv_stream_mma_kernel<BITS, GS, __half, I8>); break;
    case FloatType::kBF16: go(gemv_stream_mma_kernel<BITS, GS, __nv_bfloat16, I8>); break;
  }
  return true;
}

// The tensor-core walk where its preconditions hold; false otherwise.
template <int BITS>
bool launch_mma_bits(const Ctx& ctx, const GemvArgs& a, int slots, int64_t n_tiles, const ArgmaxTail& tail) {
  const WeightView& w = a.w[0];
  const int gs = int(w.group_size);
  if ((gs != 32 && gs != 64 && gs != 128) || w.in % gs != 0 || w.out % kRows != 0) return false;
  const int rot = gs == 32 ? bulk::kRot<BITS, 32> : gs == 64 ? bulk::kRot<BITS, 64> : bulk::kRot<BITS, 128>;
  const int64_t groups = w.in / gs;
  if (groups % (kQuarters * rot) != 0) return false;
  auto by_gs = [&]<bool I8>() {
    switch (gs) {
      case 32: return launch_mma_gs<BITS, 32, I8>(ctx, a, slots, n_tiles, tail);
      case 64: return launch_mma_gs<BITS, 64, I8>(ctx, a, slots, n_tiles, tail);
      default: return launch_mma_gs<BITS, 128, I8>(ctx, a, slots, n_tiles, tail);
    }
  };
  return ctx.gemv_stream_mma == 1 ? by_gs.template operator()<true>() : by_gs.template operator()<false>();
}

}  // namespace

bool gemv::launch_gemv_stream(const Ctx& ctx, GemvArgs& a, const ArgmaxTail* tail_in) {
  const ArgmaxTail tail = tail_in ? *tail_in : ArgmaxTail{};
  const WeightView& w = a.w[0];
  const int slots = std::min(ctx.gemv_stream, kMaxSlots);
  if (slots < 2 || a.n_parts != 1 || a.map.indices || a.f.residual || a.f.router.k > 0 || a.f.share.parts ||
      w.out < kStreamRows || w.out % 8 != 0 || w.n_stack != 1 || !bulk::bulk_rows_ok(w) || w.in % kChunk != 0 ||
      reinterpret_cast<uintptr_t>(w.w) % 16 != 0 || w.out >= (int64_t(1) << 31)) {
    return false;
  }
  const int64_t row_bytes = bulk::packed_row_bytes(w.in, w.bits), srow = bulk::scale_row_bytes_of(w);
  const size_t smem = bulk::kBarBytes + size_t(slots) * size_t(bulk::RowTile<4, float>::bytes(kRows, row_bytes, srow)) +
                      bulk::staged_floats_bytes(w.in);
  if (smem > size_t(ctx.max_smem_optin)) return false;
  const int64_t n_tiles = (w.out + kRows - 1) / kRows;
  if (ctx.gemv_stream_mma && (w.bits == 4 ? launch_mma_bits<4>(ctx, a, slots, n_tiles, tail)
                                          : launch_mma_bits<8>(ctx, a, slots, n_tiles, tail))) {
    return true;
  }
  w.bits == 4 ? launch_bits<4>(ctx, a, smem, slots, n_tiles, tail) : launch_bits<8>(ctx, a, smem, slots, n_tiles, tail);
  return true;
}

}  // namespace moecel::cuda
