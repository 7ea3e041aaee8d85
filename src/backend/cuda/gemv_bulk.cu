// The matrix-vector kernel of one normalized token (OLMoE's q, k and v after the input RMSNorm) or of the gather
// path's expert pairs, fed by bulk copies: each block's weight rows, scales and biases go to shared memory in three
// copy instructions before the wait for the previous kernel, as the fused kernel B's do. The register-prefetch kernel
// (qgemv.cu) holds 16 of its 80 registers in weights, so its 384 blocks of q, k and v could not all be resident beside
// the kernel before it and most loaded their weights after the wait; shared memory holds them with room to spare. The
// gather products (the experts are known only after the wait) use it too: 64 registers, 4 blocks per SM, a block's
// rows in flight at once. Staging, normalization and per-row sums are qgemv_kernel's (qgemv.cuh, fused_moe_dot.cuh):
// bit for bit its results.
#include <algorithm>

#include "backend/cuda/fused_moe_bulk.cuh"
#include "backend/cuda/fused_moe_dot.cuh"
#include "backend/cuda/qgemv.cuh"

namespace moecel::cuda {
namespace {

using gemv::GemvArgs;
using gemv::kThreads;
constexpr int kWarps = gemv::kWarps;
static_assert(kWarps == 8, "gemv_bulk_kernel's stages: stage_shift = log2(8 / stages)");

// A stage's bulk copy: its global source, its destination (an offset into the dynamic shared memory) and bytes
// (0: none).
struct PendingCopy {
  const unsigned char* src;
  uint32_t dst, bytes;
};
constexpr int kMaxStages = 8, kStageCopies = 6;  // per stage: each part's packed rows, scales and biases
constexpr size_t kPendingBytes = kMaxStages * kStageCopies * sizeof(PendingCopy);

// bulk::row_copies recorded in p[0 .. 3) for a warp to issue later.
template <int BITS, typename ST>
__device__ __forceinline__ void record_rows(const WeightView& w, int64_t row, int n,
                                            const bulk::RowTile<BITS, ST>& tile, int first, const unsigned char* smem,
                                            PendingCopy* p) {
  int i = 0;
  bulk::row_copies(w, row, n, tile, first, [&](const unsigned char* src, const unsigned char* dst, unsigned bytes) {
    p[i++] = {src, uint32_t(dst - smem), bytes};
  });
}

// Announces a recorded stage's bytes on its barrier and issues its N copies.
template <int N>
__device__ __forceinline__ void issue_pending(const PendingCopy* p, unsigned char* smem, uint64_t* bar) {
  PendingCopy c[N];
#pragma unroll
  for (int i = 0; i < N; ++i) c[i] = p[i];
  unsigned total = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) total += c[i].bytes;
  mbar_arrive_expect(bar, total);
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (c[i].bytes > 0) bulk_copy_once(smem + c[i].dst, c[i].src, c[i].bytes, bar);
  }
}

// Grid (the blocks of every part, kWarps * RPW rows each; pairs). Pair p reads expert map.indices[p] when given (the
// copies then wait for the kernel that wrote the indices; else they go out before the wait). With a.glu, a block's
// rows are kWarps * RPW / 2 rows of part 0 (gate) and the same rows of part 1 (up): each warp sums RPW / 2 rows of
// each and writes act(gate) * up (glu_value, as launch_glu), so the gather path's activation needs no launch of its
// own. Shared memory: the barrier, the block's row tile, x staged. Preconditions (launch_gemv_bulk): bulk_rows_ok
// for every part; in % 32 == 0; with glu, parts 0 and 1 of the same shape.
// GATHER: a.map.indices is set (then no norm); else a.f.norm_w is set and one stage of copies (launch_gemv_bulk). A
// variant each, so that q/k/v's carries none of the gather path's code.
template <int BITS, typename ST, int RPW, bool GLU, bool GATHER>
__global__ void __launch_bounds__(kThreads, 4) gemv_bulk_kernel(GemvArgs a) {
  static_assert(GATHER || !GLU, "the glu epilogue is the gather path's");
  extern __shared__ float4 smem4[];
  constexpr int kHalf = RPW / 2;
  constexpr int rpw = GLU ? kHalf : RPW;  // rows of a part per warp
  constexpr int kRows = kWarps * rpw;     // rows of a part per block
  const gemv::Part pt = gemv::block_part(a);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t p = blockIdx.y, in = pt.w.in, out = pt.w.out, n_chunks = in / kChunk, r0 = pt.block * kRows;
  const int n_rows = int(bulk::min64(kRows, out - r0));
  const int64_t row_bytes = bulk::packed_row_bytes(in, BITS), srow = bulk::scale_row_bytes<ST>(in, pt.w.group_size);
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  auto* bar = reinterpret_cast<uint64_t*>(smem);
  unsigned char* base = smem + bulk::kBarBytes;
  const int tile_rows = GLU ? 2 * n_rows : n_rows;  // with glu: gate's rows, then up's
  const bulk::RowTile<BITS, ST> tile{base, row_bytes, srow, tile_rows};
  float* xs = reinterpret_cast<float*>(base + bulk::RowTile<BITS, ST>::bytes(kWarps * RPW, row_bytes, srow));
  auto* pending = reinterpret_cast<PendingCopy*>(xs + n_chunks * kChunkPad);  // only with stages > depth
  // a.stages barriers: stage s holds the rows of warps [s * kWarps / stages, (s + 1) * kWarps / stages) of each part.
  // The first a.depth stages' copies go out at once; the rest wait in `pending` until lane 0 of stage s's first warp
  // issues stage s + depth's once its own rows have landed, so the bytes arrive in stage order and the first warps
  // compute while the rest arrive. (Recorded in shared memory: kept in registers, they made the kernel spill.)
  uint32_t nraw[gemv::kNormRegs];
  if constexpr (!GATHER) gemv::load_norm_raw(a, in, nraw);  // before the barrier: ahead of thread 0's copies
  if (threadIdx.x < (GATHER ? a.stages : 1)) mbar_init(bar + threadIdx.x, 1);
  __syncthreads();
  // indices_final: the expert is known before the wait (the indices' writer finished before the previous kernel let
  // this one start).
  const bool early = GATHER && a.map.indices_final;
  int64_t expert = 0;
  if (GATHER && !early) {
    pdl_enter();
    expert = gemv::pair_expert(a, pt, p, rpw);
    if (expert < 0) return;  // uniform; no copy was issued
  }
  if (early) {
    const int64_t e = __ldcg(a.map.indices + p);
    expert = e >= 0 && e < pt.w.n_stack ? e : -1;
  }
  if (threadIdx.x == 0 && expert >= 0) {  // weights only: before the wait where the rows are known
    if (!GATHER || a.stages == 1) {       // straight copies: with no wait before them they are on the chain
      mbar_arrive_expect(bar, unsigned(tile_rows * (row_bytes + 2 * srow)));
      bulk::issue_rows(pt.w, expert * out + r0, n_rows, tile, bar);
      if constexpr (GLU) bulk::issue_rows(a.w[1], expert * out + r0, n_rows, tile, bar, n_rows);
    } else {
      const int srows = kRows >> (3 - a.stage_shift);  // rows of a part per stage (kWarps == 8)
      for (int s = 0; s < a.stages; ++s) {
        const int first = s * srows, n = max(0, min(srows, n_rows - first));
        const int64_t row = expert * out + r0 + first;
        if (s < a.depth) {
          mbar_arrive_expect(bar + s, unsigned((GLU ? 2 : 1) * n * (row_bytes + 2 * srow)));
          if (n == 0) continue;
          bulk::issue_rows(pt.w, row, n, tile, bar + s, first);
          if constexpr (GLU) bulk::issue_rows(a.w[1], row, n, tile, bar + s, n_rows + first);
        } else {
          record_rows(pt.w, row, n, tile, first, smem, pending + s * kStageCopies);
          if constexpr (GLU) record_rows(a.w[1], row, n, tile, n_rows + first, smem, pending + s * kStageCopies + 3);
        }
      }
    }
  }
  float nw[gemv::kNormRegs];
  if constexpr (!GATHER) gemv::convert_norm(a, nraw, nw);
  if (!GATHER || early) pdl_enter();
  if (expert < 0) {  // a bad index (early): NaN rows and the error flag, written after the wait
    gemv::pair_expert(a, pt, p, rpw);
    return;
  }
  if constexpr (GATHER) {
    stage_chunks(gemv::pair_x(a, in, p), in, xs);
    __syncthreads();
  } else {
    gemv::stage_normalized(a, in, p, gemv::pair_x(a, in, p), xs, nw);
  }
  stage_xsums(xs, n_chunks);
  __syncthreads();
  probe_mark(0);
  const int64_t row0 = r0 + warp * rpw;
  if (row0 >= out) return;  // warp 0 always stays: the block outlives its copies
  const int gshift = __ffs(pt.w.group_size / kChunk) - 1;
  int lr[RPW];  // the warp's rows in the tile (a row past the end reads the last one; its result is dropped)
#pragma unroll
  for (int i = 0; i < RPW; ++i) {
    lr[i] =
        GLU ? (i < kHalf ? 0 : n_rows) + min(warp * kHalf + i % kHalf, n_rows - 1) : min(warp * RPW + i, n_rows - 1);
  }
  float acc[RPW];
#pragma unroll
  for (int i = 0; i < RPW; ++i) acc[i] = 0.0f;
  const int stage = GATHER ? warp >> a.stage_shift : 0;  // warps per stage: 1 << stage_shift
  mbar_wait(bar + stage, 0);
  if (stage == 0) probe_mark(1);
  if (GATHER && lane == 0 && (warp & ((1 << a.stage_shift) - 1)) == 0 && stage + a.depth < a.stages) {
    const int s2 = stage + a.depth;
    issue_pending<GLU ? 6 : 3>(pending + s2 * kStageCopies, smem, bar + s2);
  }
  bulk::tile_rows_dot(tile, lr, int(n_chunks), gshift, xs, lane, acc);
#pragma unroll
  for (int i = 0; i < RPW; ++i) acc[i] = warp_sum(acc[i]);
  probe_mark(2);
  if (lane == 0) {
    if constexpr (GLU) {
#pragma unroll
      for (int i = 0; i < kHalf; ++i)
        if (row0 + i < out) pt.y[p * out + row0 + i] = glu_value_of(GluAct(a.glu), acc[i], acc[i + kHalf]);
    } else {  // every row its own output
#pragma unroll
      for (int i = 0; i < RPW; ++i)
        if (row0 + i < out) pt.y[p * out + row0 + i] = acc[i];
    }
  }
}

template <int BITS, int RPW, bool GLU, bool GATHER>
void launch_rows(const Ctx& ctx, dim3 grid, size_t smem, const GemvArgs& a) {
  switch (a.w[0].stype) {
    case FloatType::kF32:
      launch_k(ctx, gemv_bulk_kernel<BITS, float, RPW, GLU, GATHER>, grid, kThreads, smem, a);
      break;
    case FloatType::kF16:
      launch_k(ctx, gemv_bulk_kernel<BITS, __half, RPW, GLU, GATHER>, grid, kThreads, smem, a);
      break;
    case FloatType::kBF16:
      launch_k(ctx, gemv_bulk_kernel<BITS, __nv_bfloat16, RPW, GLU, GATHER>, grid, kThreads, smem, a);
      break;
  }
}

template <int BITS>
void launch_bits(const Ctx& ctx, dim3 grid, size_t smem, const GemvArgs& a, int rpw) {
  const bool glu = a.glu >= 0, gather = a.map.indices != nullptr;
  if (glu) {
    rpw == 4 ? launch_rows<BITS, 4, true, true>(ctx, grid, smem, a)
             : launch_rows<BITS, 2, true, true>(ctx, grid, smem, a);
  } else if (gather) {
    rpw == 4 ? launch_rows<BITS, 4, false, true>(ctx, grid, smem, a)
             : launch_rows<BITS, 2, false, true>(ctx, grid, smem, a);
  } else {
    rpw == 4 ? launch_rows<BITS, 4, false, false>(ctx, grid, smem, a)
             : launch_rows<BITS, 2, false, false>(ctx, grid, smem, a);
  }
}

}  // namespace

bool gemv::bulk_weight_ok(const Ctx& ctx, const WeightView& w) {
  return (w.bits == 4 || w.bits == 8) && w.biases && bulk::bulk_rows_ok(w) &&
         reinterpret_cast<uintptr_t>(w.w) % 16 == 0 && !decode_mma_applies(ctx, w);
}

bool gemv::launch_gemv_bulk(const Ctx& ctx, GemvArgs& a, int64_t n_pairs) {
  const bool gather = a.map.indices != nullptr;
  const int rpw = a.glu >= 0 ? ctx.gemv_bulk_glu : gather ? ctx.gemv_bulk_gather : ctx.gemv_bulk;
  if (rpw == 0 || a.f.residual || a.f.router.k > 0 || a.f.share.parts || (gather == (a.f.norm_w != nullptr)) ||
      n_pairs < 1 || n_pairs > (gather ? 65535 : 1)) {
    return false;
  }
  const WeightView& w = a.w[0];
  if (w.bits != 4 && w.bits != 8) return false;
  if (a.glu >= 0 && (!gather || a.n_parts != 2 || a.w[1].out != w.out || a.w[1].n_stack != w.n_stack)) return false;
  for (int i = 0; i < a.n_parts; ++i) {
    const WeightView& v = a.w[i];
    if (v.in != w.in || v.bits != w.bits || v.stype != w.stype || v.group_size != w.group_size ||
        (v.n_stack != 1 && !gather) || v.out % 8 != 0 || !bulk_weight_ok(ctx, v)) {
      return false;
    }
  }
  if (!gather && launch_gemv_bulk_imma(ctx, a)) return true;
  const int rows = kWarps * rpw;
  // Each stage's scales and biases must be whole 16-byte spans (stage starts are multiples of its rows).
  const int part_rows = a.glu >= 0 ? rows / 2 : rows;
  a.stages = !gather ? 1 : a.glu >= 0 ? ctx.gemv_stages : ctx.gemv_down_stages;
  a.depth = gather ? ctx.gemv_depth : 1;
  while (a.stages > 1 && (part_rows / a.stages) * bulk::scale_row_bytes_of(w) % 16 != 0) a.stages /= 2;
  a.stage_shift = __builtin_ctz(unsigned(kWarps / a.stages));
  const size_t smem =
      bulk::kBarBytes +
      size_t(bulk::RowTile<4, float>::bytes(rows, bulk::packed_row_bytes(w.in, w.bits), bulk::scale_row_bytes_of(w))) +
      bulk::staged_floats_bytes(w.in) + (a.stages > a.depth ? kPendingBytes : 0);
  if (w.in % kChunk != 0 || smem > size_t(ctx.max_smem_optin)) return false;
  int64_t blocks = 0;
  if (a.glu >= 0) {  // one block per rows / 2 rows of both parts
    blocks = (w.out + rows / 2 - 1) / (rows / 2);
    a.part_end[0] = a.part_end[1] = unsigned(blocks);
  } else {
    for (int i = 0; i < a.n_parts; ++i) {
      blocks += (a.w[i].out + rows - 1) / rows;
      a.part_end[i] = unsigned(blocks);
    }
  }
  if (blocks == 0) return true;
  CUDA_REQUIRE(blocks < (int64_t(1) << 31), "gemv_bulk: too many output rows");
  const dim3 grid{unsigned(blocks), unsigned(n_pairs)};
  w.bits == 4 ? launch_bits<4>(ctx, grid, smem, a, rpw) : launch_bits<8>(ctx, grid, smem, a, rpw);
  return true;
}

}  // namespace moecel::cuda
