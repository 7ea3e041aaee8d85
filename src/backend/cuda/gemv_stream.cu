// The streaming matrix-vector kernel for one large single-token product (the vocabulary projection, after the final
// RMSNorm): one block per SM walks a contiguous run of 32-row tiles through a ring of shared-memory slots fed by
// bulk copies, so the normalized x is staged once per block (not once per 16 rows, as gemv_bulk_kernel's thousands of
// blocks do) and the ring keeps DRAM busy while the warps compute. Per-row arithmetic (staging, normalization, chunk
// sums, the lane order of the dot product) is gemv_bulk_kernel's, so the logits are bit for bit the same.
#include <algorithm>

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

// Grid (resident blocks): block b takes tiles [b * n_tiles / G, (b + 1) * n_tiles / G) of a.w[0] (one part; y[0]).
// Shared memory: the slots' barriers, `slots` tiles of kRows rows (RowTile layout), x staged. Tile i of the block sits
// in slot i % slots; thread 0 refills a slot once every warp is done with it. Preconditions (launch_gemv_stream):
// one part, bulk_rows_ok, in % 32 == 0.
template <int BITS, typename ST>
__global__ void __launch_bounds__(kThreads, 1) gemv_stream_kernel(GemvArgs a, int slots, int64_t n_tiles) {
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
  if (threadIdx.x < slots) mbar_init(bar + threadIdx.x, 1);
  __syncthreads();
  if (threadIdx.x == 0) {  // weights only: before the wait
    for (int s = 0; s < slots && t0 + s < t1; ++s) issue(t0 + s, s);
  }
  float nw[gemv::kNormRegs];
  gemv::load_norm(a, in, nw);
  pdl_enter();
  stage_chunks(a.x, in, xs);
  __syncthreads();
  if (a.f.norm_w) gemv::normalize_staged(a, in, 0, xs, nw);
  stage_xsums(xs, n_chunks);
  __syncthreads();
  const int gshift = __ffs(w.group_size / kChunk) - 1;
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
      for (int k = 0; k < kRpw; ++k)
        if (warp * kRpw + k < n_rows) a.y[0][r0 + warp * kRpw + k] = acc[k];
    }
    __syncthreads();  // every warp is done with slot s
    if (threadIdx.x == 0 && t + slots < t1) issue(t + slots, s);
  }
}

template <int BITS>
void launch_bits(const Ctx& ctx, const GemvArgs& a, size_t smem, int slots, int64_t n_tiles) {
  auto go = [&](auto kernel) {
    const int64_t resident = int64_t(resident_per_sm(kernel, kThreads, smem)) * std::max(ctx.sm_count, 1);
    const dim3 grid{unsigned(std::min(n_tiles, std::max<int64_t>(1, resident)))};
    launch_k(ctx, kernel, grid, kThreads, smem, a, slots, n_tiles);
  };
  switch (a.w[0].stype) {
    case FloatType::kF32: go(gemv_stream_kernel<BITS, float>); break;
    case FloatType::kF16: go(gemv_stream_kernel<BITS, __half>); break;
    case FloatType::kBF16: go(gemv_stream_kernel<BITS, __nv_bfloat16>); break;
  }
}

}  // namespace

bool gemv::launch_gemv_stream(const Ctx& ctx, GemvArgs& a) {
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
  w.bits == 4 ? launch_bits<4>(ctx, a, smem, slots, n_tiles) : launch_bits<8>(ctx, a, smem, slots, n_tiles);
  return true;
}

}  // namespace moecel::cuda
