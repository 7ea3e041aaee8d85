// Fused decode-MoE kernels on tensor cores, for 4- and 8-bit experts with group size 32, 64 or 128, opt-in with
// MOECEL_CUDA_DECODE_MMA=1 (the building blocks and numerics: gemv_mma.cuh). Each row's dot product is computed
// exactly as the gather path's tensor-core matrix-vector kernel computes it (qgemv_mma.cu: same tasks, same slice
// order), and the activation and the slot-ordered weighted sum are the gather path's, so the two paths agree bit
// for bit.
//   Kernel A: resident blocks walk virtual blocks (slot, tile group); a block stages x once and runs the gate and
//   up tasks; act[j, r] = glu(gate . x, up . x).
//   Kernel B, grid (hidden row tiles): a block stages the act rows of its slots (in batches when they do not all
//   fit in shared memory), runs the down tasks of every slot, and writes out[r] = residual[r] +
//   sum_j weights[j] * (down[e_j][r] . act[j]) once. Its first tasks' weights are requested before the wait for
//   kernel A (the indices are read through L2: they were final before kernel A started).
#include <algorithm>

#include "backend/cuda/fused_moe.cuh"
#include "backend/cuda/gemv_mma.cuh"
#include "backend/cuda/qgemv.cuh"

namespace moecel::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// Kernel B runs one block per SM (its act planes take ~50 KB for OLMoE), so its warps keep more tasks in flight
// when that fits in shared memory (else the default ring depth).
constexpr int kDownStages = 6;
constexpr int kGateUpStages = 4;  // kernel A: two blocks per SM still fit with 4-bit weights

// Shared memory (byte offsets, multiples of 16): slot_batch vectors' bf16 planes | their group sums | partial
// sums | each warp's ring of weight stages.
struct MoeMmaShape {
  int tiles = 1;        // tiles of 16 rows per virtual block
  int n_slices = 1;     // slices of the vector
  int slot_batch = 1;   // kernel B: act rows staged at once
  int vb_per_slot = 1;  // kernel A: virtual blocks per slot
  size_t xsum = 0, part = 0, ring = 0, bytes = 0;
};

MoeMmaShape moe_shape(int64_t vec, int gs, int tiles, int slot_batch, int64_t part_vectors, int stage_bytes,
                      int stages) {
  MoeMmaShape sh;
  sh.tiles = tiles;
  sh.n_slices = int((vec + kMmaSlice - 1) / kMmaSlice);
  sh.slot_batch = slot_batch;
  sh.xsum = size_t(slot_batch) * 3 * size_t(mma_plane_bytes(vec));
  sh.part = sh.xsum + (size_t(slot_batch) * size_t(vec / gs) * sizeof(float) + 15) / 16 * 16;
  sh.ring = sh.part + size_t(tiles) * size_t(part_vectors) * sh.n_slices * kMmaTileRows * sizeof(float);
  sh.bytes = sh.ring + size_t(kWarps) * stages * stage_bytes;
  return sh;
}

// The kernels' shared memory regions (moe_shape's layout).
struct MoeSmem {
  unsigned char* planes;
  float* xsum;
  float* part;
};
__device__ __forceinline__ MoeSmem moe_smem(float4* base, const MoeMmaShape& sh) {
  unsigned char* p = reinterpret_cast<unsigned char*>(base);
  return {p, reinterpret_cast<float*>(p + sh.xsum), reinterpret_cast<float*>(p + sh.part)};
}

__device__ __forceinline__ bool valid_expert(int64_t e, int64_t n) {
  return e >= 0 && e < n;
}

// Rows tile * 16 .. of expert e of weight w, slice `slice`.
template <typename ST, int BITS, int GS>
__device__ __forceinline__ TaskSrc<ST> expert_src(const WeightView& w, int64_t e, int64_t tile, int slice) {
  return {static_cast<const unsigned char*>(w.w),
          static_cast<const ST*>(w.scales),
          static_cast<const ST*>(w.biases),
          e * w.out + tile * kMmaTileRows,
          e * w.out + w.out - 1,
          w.in * BITS / 8,
          w.in / GS,
          slice};
}

// Virtual block vb = slot j * vb_per_slot + its tile group; its units are (tile, m), unit = tile * 2 + m, m = 0 gate,
// 1 up; partial sums part[unit][slice][16]. Grid: resident blocks, walking the virtual blocks grid-stride.
template <int BITS, int GS, typename ST, GluAct ACT, int S>
__global__ void __launch_bounds__(kThreads) fused_gate_up_mma_kernel(FusedMoeArgs a, MoeMmaShape sh, unsigned* err) {
  using Stage = MmaStage<BITS, GS, ST>;
  extern __shared__ float4 smem4[];
  const auto [planes, xsum, part] = moe_smem(smem4, sh);
  __shared__ int32_t experts[kMaxTopK];
  pdl_enter();  // the indices and x come from the kernels before
  if (threadIdx.x < a.k) experts[threadIdx.x] = a.indices[threadIdx.x];
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned char* ring = planes + sh.ring + warp * (S * Stage::kBytes);
  const int64_t ffn = a.gate.out, hidden = a.gate.in, groups = hidden / GS;
  const int n_slices = sh.n_slices, vb_per_slot = sh.vb_per_slot;
  // Kernel B's staged operand (fused_act_bytes): each slot's three planes for down's group size, then the
  // octet sums of every slot.
  const int64_t down_plane = mma_plane_bytes(ffn), staged_slot = 3 * down_plane;
  const int down_shift = __ffs(a.down.group_size) - 1;
  const RoundMap rm(vb_per_slot * a.k, 2 * sh.tiles, n_slices, warp, kWarps);  // units: (tile, gate / up)
  // This warp's task in round rd: expert e, unit (tile * 2 + m) and slice; or none.
  auto task = [&](const Round& rd, int64_t& e, int& unit, int& slice, int64_t& tile) {
    if (!rm.task(rd, unit, slice)) return false;
    const unsigned vb = unsigned(rd.vb), j = vb / unsigned(vb_per_slot);  // 32-bit: this runs per task
    e = j < unsigned(a.k) ? experts[j] : -1;
    tile = int64_t(vb - j * unsigned(vb_per_slot)) * sh.tiles + (unit >> 1);
    return tile * kMmaTileRows < ffn && valid_expert(e, a.gate.n_stack);
  };
  auto issue = [&](const Round& rd, int stage) {
    int64_t e, tile;
    int unit, slice;
    if (!task(rd, e, unit, slice, tile)) return;
    const WeightView& w = (unit & 1) == 0 ? a.gate : a.up;
    mma_issue<BITS, GS>(ring + stage * Stage::kBytes, expert_src<ST, BITS, GS>(w, e, tile, slice), lane);
  };
  const int64_t plane = mma_plane_bytes(hidden);
  auto compute = [&](const Round& rd, int stage) {
    int64_t e, tile;
    int unit, slice;
    if (!task(rd, e, unit, slice, tile)) return;
    float r0, r1;
    mma_compute<BITS, GS, ST>(ring + stage * Stage::kBytes, slice, groups, planes, plane, xsum, lane, r0, r1);
    if ((lane & 3) == 0) {
      float* dst = part + (unit * n_slices + slice) * kMmaTileRows;  // part[tile][m][slice][row]
      dst[lane >> 2] = r0;
      dst[(lane >> 2) + 8] = r1;
    }
  };
  auto after = [&](const Round& rd) {  // at a virtual block's last round: act = glu(gate, up) for its rows
    if (!rd.last) return;
    __syncthreads();
    const int j = rd.vb / vb_per_slot;
    const int64_t tile0 = int64_t(rd.vb - j * vb_per_slot) * sh.tiles;
    const bool ok = valid_expert(experts[j], a.gate.n_stack);
    if (!ok && threadIdx.x == 0) raise_device_error(err, kErrExpertIndex);
    // One row per thread; lanes 8o .. 8o + 7 hold octet o, which lane 8o stages for kernel B (warp-uniform
    // trip count: every lane takes part in the shuffles).
    for (int i0 = 0; i0 < sh.tiles * kMmaTileRows; i0 += kThreads) {
      const int i = i0 + threadIdx.x;
      const int64_t row = tile0 * kMmaTileRows + i;
      const bool live = i < sh.tiles * kMmaTileRows && row < ffn;
      float v = 0.0f;
      if (live) {
        const float* pg = part + (i / kMmaTileRows) * 2 * n_slices * kMmaTileRows + i % kMmaTileRows;
        const float g = fold_slices(pg, n_slices, kMmaTileRows);
        const float u = fold_slices(pg + n_slices * kMmaTileRows, n_slices, kMmaTileRows);
        v = ok ? glu_value<ACT>(g, u) : __int_as_float(0x7fc00000);
        a.act[j * ffn + row] = v;
      }
      if (a.act_staged) {
        float oct[8];
#pragma unroll
        for (int r = 0; r < 8; ++r) oct[r] = __shfl_sync(0xffffffffu, v, (lane & ~7) + r);
        if (live && (lane & 7) == 0) {  // ffn % 32 == 0: an octet is all live or all not
          mma_put_octet(a.act_staged + j * staged_slot, down_plane, down_shift, row, oct);
          reinterpret_cast<float*>(a.act_staged + a.k * staged_slot)[(j * ffn + row) / 8] = octet_sum(oct);
        }
      }
    }
    __syncthreads();
  };
  const bool vec = (reinterpret_cast<uintptr_t>(a.x) & 15) == 0;
  pipeline<S>(
      rm, issue, compute,
      [&] {
        mma_stage<GS>(
            hidden, [&](int64_t i, float(&v)[8]) { load8_global(a.x + i, vec, v); }, planes, xsum);
        __syncthreads();
      },
      after);
}

// One tile of hidden rows per block. Slots are staged slot_batch at a time; a batch's units are its slots;
// partial sums part[slot][slice][16] over all k slots.
template <int BITS, int GS, typename ST, int S>
__global__ void __launch_bounds__(kThreads) fused_down_mma_kernel(FusedMoeArgs a, MoeMmaShape sh, unsigned* err) {
  using Stage = MmaStage<BITS, GS, ST>;
  extern __shared__ float4 smem4[];
  const auto [planes, xsum, part] = moe_smem(smem4, sh);
  __shared__ int32_t experts[kMaxTopK];
  if (!a.b_prefetch) pdl_enter();
  // Read through L2 before pdl_wait: the router finished before kernel A passed its wait and let this start.
  if (threadIdx.x < a.k) experts[threadIdx.x] = __ldcg(a.indices + threadIdx.x);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned char* ring = planes + sh.ring + warp * (S * Stage::kBytes);
  const int64_t hidden = a.down.out, ffn = a.down.in, tile = blockIdx.x;
  const int n_slices = sh.n_slices, k = a.k;
  const int64_t plane = mma_plane_bytes(ffn), groups = ffn / GS;
  const bool vec = (reinterpret_cast<uintptr_t>(a.act) & 15) == 0;
  for (int j0 = 0; j0 < k; j0 += sh.slot_batch) {
    const int nb = min(sh.slot_batch, k - j0);
    const RoundMap rm(gridDim.x, nb, n_slices, warp, kWarps);  // units: the batch's slots
    auto task = [&](const Round& rd, int& s, int& slice, int64_t& e) {
      if (!rm.task(rd, s, slice)) return false;
      e = experts[j0 + s];
      return valid_expert(e, a.down.n_stack);
    };
    auto issue = [&](const Round& rd, int stage) {
      int s, slice;
      int64_t e;
      if (!task(rd, s, slice, e)) return;
      mma_issue<BITS, GS>(ring + stage * Stage::kBytes, expert_src<ST, BITS, GS>(a.down, e, tile, slice), lane);
    };
    auto compute = [&](const Round& rd, int stage) {
      int s, slice;
      int64_t e;
      if (!task(rd, s, slice, e)) return;
      float r0, r1;
      mma_compute<BITS, GS, ST>(ring + stage * Stage::kBytes, slice, groups, planes + s * 3 * plane, plane,
                                xsum + s * groups, lane, r0, r1);
      if ((lane & 3) == 0) {
        float* dst = part + ((j0 + s) * n_slices + slice) * kMmaTileRows;  // part[slot][slice][row]
        dst[lane >> 2] = r0;
        dst[(lane >> 2) + 8] = r1;
      }
    };
    pipeline<S>(
        rm, issue, compute,
        [&] {
          if (j0 == 0 && a.b_prefetch) pdl_enter();  // the first weights are in flight: wait for kernel A's act
          if (j0 > 0) __syncthreads();               // every warp is done with the previous batch's planes
          if (a.act_staged) {                        // staged by kernel A: copy the planes, add up the octet sums
            const uint4* src = reinterpret_cast<const uint4*>(a.act_staged + j0 * 3 * plane);
            for (int64_t c = threadIdx.x; c < nb * 3 * plane / 16; c += kThreads) {
              reinterpret_cast<uint4*>(planes)[c] = src[c];
            }
            const float* octs = reinterpret_cast<const float*>(a.act_staged + k * 3 * plane) + j0 * ffn / 8;
            for (int64_t q = threadIdx.x; q < nb * groups; q += kThreads) {
              xsum[q] = group_sum_of_octets(octs + q * (GS / 8), GS / 8);
            }
          } else {
            for (int s = 0; s < nb; ++s) {
              const float* src = a.act + (j0 + s) * ffn;
              mma_stage<GS>(
                  ffn, [&](int64_t i, float(&v)[8]) { load8_global(src + i, vec, v); }, planes + s * 3 * plane,
                  xsum + s * groups);
            }
          }
          __syncthreads();
        },
        [](const Round&) {});
  }
  __syncthreads();
  bool any_invalid = false;
  for (int i = threadIdx.x; i < kMmaTileRows; i += kThreads) {
    const int64_t row = tile * kMmaTileRows + i;
    if (row >= hidden) continue;
    float out = 0.0f;
    for (int j = 0; j < k; ++j) {
      if (!valid_expert(experts[j], a.down.n_stack)) {
        any_invalid = true;
        out = __int_as_float(0x7fc00000);
      } else {  // the gather path's weighted sum, same order
        out = fmaf(a.weights[j], fold_slices(part + j * n_slices * kMmaTileRows + i, n_slices, kMmaTileRows), out);
      }
    }
    a.out[row] = a.residual ? a.residual[row] + out : out;
  }
  if (any_invalid && tile == 0) raise_device_error(err, kErrExpertIndex);
}

template <int BITS, int GS, typename ST, GluAct ACT>
void launch_a_grid(const Ctx& ctx, const FusedMoeArgs& a, int64_t n_vb, MoeMmaShape sh) {
  // The deeper ring where it fits; else the default one (which fits wherever the gather path's kernel does).
  const MoeMmaShape deep = moe_shape(a.gate.in, GS, sh.tiles, 1, 2, MmaStage<BITS, GS, ST>::kBytes, kGateUpStages);
  auto go = [&](auto kernel, const MoeMmaShape& s) {
    const int64_t resident = int64_t(resident_per_sm(kernel, kThreads, s.bytes)) * std::max(ctx.sm_count, 1);
    launch_k(ctx, kernel, dim3(unsigned(std::min(n_vb, resident))), kThreads, s.bytes, a, s, ctx.error_flag);
  };
  if (deep.bytes <= size_t(ctx.max_smem_optin)) {
    MoeMmaShape d = deep;
    d.vb_per_slot = sh.vb_per_slot;
    go(fused_gate_up_mma_kernel<BITS, GS, ST, ACT, kGateUpStages>, d);
  } else {
    go(fused_gate_up_mma_kernel<BITS, GS, ST, ACT, kMmaStages>, sh);
  }
}

template <int BITS, int GS, typename ST>
void launch_a_act(const Ctx& ctx, const FusedMoeArgs& a, int64_t n_vb, const MoeMmaShape& sh) {
  switch (a.glu) {
    case GluAct::kSiLU: launch_a_grid<BITS, GS, ST, GluAct::kSiLU>(ctx, a, n_vb, sh); break;
    case GluAct::kGeLU: launch_a_grid<BITS, GS, ST, GluAct::kGeLU>(ctx, a, n_vb, sh); break;
    case GluAct::kReLU2: launch_a_grid<BITS, GS, ST, GluAct::kReLU2>(ctx, a, n_vb, sh); break;
  }
}

}  // namespace

size_t fused_act_bytes(int64_t ffn, int k) {
  return size_t(k) * (3 * size_t(mma_plane_bytes(ffn)) + size_t(ffn / 8) * sizeof(float));
}

bool launch_fused_gate_up_mma(const Ctx& ctx, const FusedMoeArgs& a) {
  // Only where the gather path's products take the tensor-core kernel too.
  if (!gemv::gemv_mma_takes(ctx, a.gate) || !gemv::gemv_mma_takes(ctx, a.up)) return false;
  bool done = false;
  dispatch(a.gate, [&]<int BITS, int GS, typename ST>() {
    if (!mma_scales_aligned(a.gate.in / GS, GS, int(sizeof(ST)))) return;
    const int n_slices = int((a.gate.in + kMmaSlice - 1) / kMmaSlice);
    MoeMmaShape sh =
        moe_shape(a.gate.in, GS, std::max(1, 8 / (2 * n_slices)), 1, 2, MmaStage<BITS, GS, ST>::kBytes, kMmaStages);
    if (sh.bytes > size_t(ctx.max_smem_optin)) return;
    const int64_t tiles = (a.gate.out + kMmaTileRows - 1) / kMmaTileRows;
    sh.vb_per_slot = int((tiles + sh.tiles - 1) / sh.tiles);
    launch_a_act<BITS, GS, ST>(ctx, a, int64_t(sh.vb_per_slot) * a.k, sh);
    done = true;
  });
  return done;
}

bool launch_fused_down_mma(const Ctx& ctx, const FusedMoeArgs& a) {
  if (!gemv::gemv_mma_takes(ctx, a.down)) return false;
  bool done = false;
  dispatch(a.down, [&]<int BITS, int GS, typename ST>() {
    if (!mma_scales_aligned(a.down.in / GS, GS, int(sizeof(ST)))) return;
    constexpr int kStage = MmaStage<BITS, GS, ST>::kBytes;
    // The deeper ring with every slot staged at once when that fits; else the default ring and the largest slot
    // batch whose act planes fit next to the partial sums of all k slots. That always fits where the gather
    // path's kernel does (it needs more: f32 x too), so both paths run the same arithmetic.
    const dim3 grid{unsigned((a.down.out + kMmaTileRows - 1) / kMmaTileRows)};
    const MoeMmaShape deep = moe_shape(a.down.in, GS, 1, a.k, a.k, kStage, kDownStages);
    if (deep.bytes <= size_t(ctx.max_smem_optin)) {
      launch_k(ctx, fused_down_mma_kernel<BITS, GS, ST, kDownStages>, grid, kThreads, deep.bytes, a, deep,
               ctx.error_flag);
      done = true;
      return;
    }
    int batch = a.k;
    MoeMmaShape sh = moe_shape(a.down.in, GS, 1, batch, a.k, kStage, kMmaStages);
    while (sh.bytes > size_t(ctx.max_smem_optin) && batch > 1) {
      sh = moe_shape(a.down.in, GS, 1, --batch, a.k, kStage, kMmaStages);
    }
    if (sh.bytes > size_t(ctx.max_smem_optin)) return;  // (not reached where the gather path's kernel fits)
    launch_k(ctx, fused_down_mma_kernel<BITS, GS, ST, kMmaStages>, grid, kThreads, sh.bytes, a, sh, ctx.error_flag);
    done = true;
  });
  return done;
}

}  // namespace moecel::cuda
