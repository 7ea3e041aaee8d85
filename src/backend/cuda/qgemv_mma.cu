// Tensor-core matrix-vector kernel for 4- and 8-bit weights (group size 32, 64 or 128), opt-in with
// MOECEL_CUDA_DECODE_MMA=1: the decode products (q/k/v, o_proj, router, lm_head, dense MLPs, the gather path's
// expert products). The building blocks and their numerics: gemv_mma.cuh. As many blocks as fit on the GPU walk
// the virtual blocks (tiles of 16 rows of every part) grid-stride; each stages x once (f32, then the fused
// RMSNorm when asked, then the bf16 planes), its warps stream their tasks through cp.async rings and write
// partial sums to shared memory, and each virtual block's rows are folded in slice order. Same fusions as
// qgemv.cu (q/k/v parts, norm, residual, router epilogue).
#include <algorithm>

#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/qgemv.cuh"

namespace moecel::cuda::gemv {
namespace {

// Shared memory (byte offsets, multiples of 16): f32 x in the padded chunk layout | 3 bf16 planes | group sums
// of x | partial sums [tile][slice][16] | each warp's ring of weight stages.
struct MmaSmem {
  size_t planes, xsum, part, ring, bytes;
};

MmaSmem mma_smem(int64_t in, int gs, int tiles, int stage_bytes, int stages) {
  const int64_t n_slices = (in + kMmaSlice - 1) / kMmaSlice;
  MmaSmem m{};
  m.planes = size_t(in / kChunk) * kChunkPad * sizeof(float);
  m.xsum = m.planes + 3 * size_t(mma_plane_bytes(in));
  m.part = m.xsum + (size_t(in / gs) * sizeof(float) + 15) / 16 * 16;
  m.ring = m.part + size_t(tiles) * n_slices * kMmaTileRows * sizeof(float);
  m.bytes = m.ring + size_t(kWarps) * stages * stage_bytes;
  return m;
}

struct MmaShape {
  int tiles;     // tiles of 16 rows per virtual block
  int n_slices;  // slices of `in`
  int64_t n_vb;  // virtual blocks of all parts
  MmaSmem smem;
};

// Grid (resident blocks, n_pairs); virtual blocks (tiles of every part) are walked grid-stride. S: each warp's ring
// stages (pipeline()).
template <int BITS, int GS, typename ST, int S>
__global__ void __launch_bounds__(kThreads) qgemv_mma_kernel(GemvArgs a, MmaShape sh) {
  using Stage = MmaStage<BITS, GS, ST>;
  extern __shared__ float4 smem4[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem4);
  float* xs = reinterpret_cast<float*>(smem);
  unsigned char* planes = smem + sh.smem.planes;
  float* xsum = reinterpret_cast<float*>(smem + sh.smem.xsum);
  float* part = reinterpret_cast<float*>(smem + sh.smem.part);
  const int64_t p = blockIdx.y;
  if (a.map.indices) pdl_wait();  // the indices come from an earlier kernel
  const int64_t in = a.w[0].in, groups = in / GS, row_bytes = in * BITS / 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n_slices = sh.n_slices;
  const RoundMap rm(int(sh.n_vb), sh.tiles, n_slices, warp, kWarps);  // units: the virtual block's tiles
  int64_t expert = 0;
  if (a.map.indices) {
    expert = a.map.indices[p];
    if (expert < 0 || expert >= a.w[0].n_stack) {  // uniform over the block: fill its rows with NaN
      if (threadIdx.x == 0) raise_device_error(a.err, kErrExpertIndex);
      for (int vb = blockIdx.x; vb < rm.n_vb; vb += gridDim.x) {
        const Part pt = part_of_block(a, unsigned(vb));
        for (int64_t i = threadIdx.x; i < int64_t(sh.tiles) * kMmaTileRows; i += kThreads) {
          const int64_t row = pt.block * sh.tiles * kMmaTileRows + i;
          if (row < pt.w.out) pt.y[p * pt.w.out + row] = __int_as_float(0x7fc00000);
        }
      }
      return;
    }
  }
  unsigned char* ring = smem + sh.smem.ring + warp * (S * Stage::kBytes);
  // This warp's task in round rd: tile `unit` of the virtual block, slice `slice`; or none.
  auto task = [&](const Round& rd, Part& pt, int& unit, int& slice) {
    pt = part_of_block(a, unsigned(rd.vb));
    return rm.task(rd, unit, slice) && (pt.block * sh.tiles + unit) * kMmaTileRows < pt.w.out;
  };
  auto issue = [&](const Round& rd, int stage) {
    Part pt;
    int unit, slice;
    if (!task(rd, pt, unit, slice)) return;
    const TaskSrc<ST> src{static_cast<const unsigned char*>(pt.w.w),
                          static_cast<const ST*>(pt.w.scales),
                          static_cast<const ST*>(pt.w.biases),
                          expert * pt.w.out + (pt.block * sh.tiles + unit) * kMmaTileRows,
                          expert * pt.w.out + pt.w.out - 1,
                          row_bytes,
                          groups,
                          slice};
    mma_issue<BITS, GS>(ring + stage * Stage::kBytes, src, lane);
  };
  const int64_t plane = mma_plane_bytes(in);
  auto compute = [&](const Round& rd, int stage) {
    Part pt;
    int unit, slice;
    if (!task(rd, pt, unit, slice)) return;
    float r0, r1;
    mma_compute<BITS, GS, ST>(ring + stage * Stage::kBytes, slice, groups, planes, plane, xsum, lane, r0, r1);
    if ((lane & 3) == 0) {
      float* dst = part + (unit * n_slices + slice) * kMmaTileRows;  // part[tile][slice][row]
      dst[lane >> 2] = r0;
      dst[(lane >> 2) + 8] = r1;
    }
  };
  auto after = [&](const Round& rd) {  // at a virtual block's last round: fold its rows in slice order
    if (!rd.last) return;
    __syncthreads();
    const Part pt = part_of_block(a, unsigned(rd.vb));
    for (int i = threadIdx.x; i < sh.tiles * kMmaTileRows; i += kThreads) {
      const int64_t row = pt.block * sh.tiles * kMmaTileRows + i;
      if (row >= pt.w.out) continue;
      const float acc =
          fold_slices(part + (i / kMmaTileRows) * n_slices * kMmaTileRows + i % kMmaTileRows, n_slices, kMmaTileRows);
      float* y = pt.y + p * pt.w.out + row;
      *y = a.f.residual ? a.f.residual[p * pt.w.out + row] + acc : acc;  // residual may be y: read first
    }
    __syncthreads();
  };
  float nw[kNormRegs];
  load_norm(a, in, nw);
  pipeline<S>(
      rm, issue, compute,
      [&] {
        pdl_enter();
        stage_chunks(pair_x(a, in, p), in, xs);
        __syncthreads();
        if (a.f.norm_w) normalize_staged(a, in, p, xs, nw);
        mma_stage_chunks<GS>(in, xs, planes, xsum);
        __syncthreads();
      },
      after);
  if (a.f.router.k > 0) router_epilogue(a);
}

// Launches as many blocks as are resident at once (split over the pairs), at most one per virtual block.
template <int BITS, int GS, typename ST>
MmaSmem smem_for(int64_t in, int tiles, int stages = kMmaStages) {
  return mma_smem(in, GS, tiles, MmaStage<BITS, GS, ST>::kBytes, stages);
}

template <int BITS, int GS, typename ST>
bool fits(const Ctx& ctx, const WeightView& w) {
  const int n_slices = int((w.in + kMmaSlice - 1) / kMmaSlice);
  return mma_scales_aligned(w.in / GS, GS, int(sizeof(ST))) &&
         smem_for<BITS, GS, ST>(w.in, std::max(1, 8 / n_slices)).bytes <= size_t(ctx.max_smem_optin);
}

// As many blocks as are resident at once (split over the pairs), at most one per virtual block.
template <int BITS, int GS, typename ST, int S>
void launch_grid_s(const Ctx& ctx, const GemvArgs& a, MmaShape sh, int64_t n_pairs) {
  sh.smem = smem_for<BITS, GS, ST>(a.w[0].in, sh.tiles, S);
  auto kernel = qgemv_mma_kernel<BITS, GS, ST, S>;
  const int64_t resident = int64_t(resident_per_sm(kernel, kThreads, sh.smem.bytes)) * std::max(ctx.sm_count, 1);
  const dim3 grid{unsigned(std::min(sh.n_vb, std::max<int64_t>(1, resident / n_pairs))), unsigned(n_pairs)};
  launch_k(ctx, kernel, grid, kThreads, sh.smem.bytes, a, sh);
}

// Ctx::mma_stages ring stages where they fit (fits() checked the default's), else the default.
template <int BITS, int GS, typename ST>
void launch_grid(const Ctx& ctx, const GemvArgs& a, MmaShape sh, int64_t n_pairs) {
  if (ctx.mma_stages == 2) return launch_grid_s<BITS, GS, ST, 2>(ctx, a, sh, n_pairs);
  if (ctx.mma_stages == 4 && smem_for<BITS, GS, ST>(a.w[0].in, sh.tiles, 4).bytes <= size_t(ctx.max_smem_optin)) {
    return launch_grid_s<BITS, GS, ST, 4>(ctx, a, sh, n_pairs);
  }
  launch_grid_s<BITS, GS, ST, kMmaStages>(ctx, a, sh, n_pairs);
}

}  // namespace

bool gemv_mma_takes(const Ctx& ctx, const WeightView& w) {
  if (!decode_mma_applies(ctx, w)) return false;
  bool ok = false;
  dispatch(w, [&]<int BITS, int GS, typename ST>() { ok = fits<BITS, GS, ST>(ctx, w); });
  return ok;
}

bool launch_gemv_mma(const Ctx& ctx, GemvArgs& a, int64_t n_pairs) {
  const WeightView& w = a.w[0];
  if (!gemv_mma_takes(ctx, w)) return false;
  const int n_slices = int((w.in + kMmaSlice - 1) / kMmaSlice);
  MmaShape sh{std::max(1, 8 / n_slices), n_slices, 0, {}};
  int64_t blocks = 0;
  for (int i = 0; i < a.n_parts; ++i) {
    if (!decode_mma_applies(ctx, a.w[i]) || a.w[i].in != w.in || a.w[i].bits != w.bits ||
        a.w[i].group_size != w.group_size || a.w[i].stype != w.stype)
      return false;
    const int64_t tiles = (a.w[i].out + kMmaTileRows - 1) / kMmaTileRows;
    blocks += (tiles + sh.tiles - 1) / sh.tiles;
    CUDA_REQUIRE(blocks < (int64_t(1) << 31), "gemv: too many output rows");
    a.part_end[i] = unsigned(blocks);
  }
  if (blocks == 0) return true;
  sh.n_vb = blocks;
  dispatch(w, [&]<int BITS, int GS, typename ST>() { launch_grid<BITS, GS, ST>(ctx, a, sh, n_pairs); });
  return true;
}

}  // namespace moecel::cuda::gemv
