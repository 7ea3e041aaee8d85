// Fused decode-MoE kernels A and B fed by bulk copies (bulk_copy.cuh): each block puts all of its weight rows,
// scales and biases in flight at once into shared memory, a few copy instructions issued by one warp, and computes
// from there. The register-prefetch kernels (fused_moe.cu) hold at most two chunk steps per row in registers, which
// took ~125 registers per thread, two blocks per SM and two waves for kernel A. The arithmetic is dot_step's, in
// the same chunk and slot order, so results are bit for bit those of the other kernels and of the gather path.
// Kernel B issues its copies before waiting for kernel A (the expert indices come from an earlier kernel) and
// waits per slot.
#include <algorithm>

#include "backend/cuda/fused_moe_bulk.cuh"
#include "backend/cuda/fused_moe_dot.cuh"

namespace moecel::cuda {
namespace {

using namespace bulk;

// Grid (ceil(ffn / (kWarps * RPW)), k). Shared memory: barriers, the gate rows, the up rows, x staged.
// act[j, r] = glu(gate[e_j][r] . x, up[e_j][r] . x), as fused_gate_up_kernel.
// Blocks per SM the register budget must allow, so that the whole grid of an OLMoE-sized layer (ffn 1024, 8
// experts) is resident at once: a second wave would load its weights only after the first finished.
constexpr int min_blocks(int rpw) {
  return rpw == 1 ? 5 : rpw == 2 ? 4 : 2;
}

template <int BITS, typename ST, GluAct ACT, int RPW>
__global__ void __launch_bounds__(kThreads, min_blocks(RPW)) fused_gate_up_bulk_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  constexpr int kRows = kWarps * RPW;  // rows of each matrix in this block
  constexpr int R = 2 * RPW;           // a warp's rows: gate rows, then up rows
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, j = blockIdx.y;
  const int64_t ffn = a.gate.out, hidden = a.gate.in, n_chunks = hidden / kChunk;
  const int n_steps = int((n_chunks + 31) / 32);
  const int64_t r0 = int64_t(blockIdx.x) * kRows;
  const int n_rows = int(min64(kRows, ffn - r0));
  const int64_t row_bytes = packed_row_bytes(hidden, BITS), srow = scale_row_bytes<ST>(hidden, a.gate.group_size);
  const int64_t tile_bytes = RowTile<BITS, ST>::bytes(n_rows, row_bytes, srow);
  auto* bars = reinterpret_cast<uint64_t*>(smem4);
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4) + kBarBytes;
  const RowTile<BITS, ST> gt{base, row_bytes, srow, n_rows}, ut{base + tile_bytes, row_bytes, srow, n_rows};
  float* xs = reinterpret_cast<float*>(base + 2 * RowTile<BITS, ST>::bytes(kRows, row_bytes, srow));
  int32_t e;
  const bool valid = gate_up_prologue(a, j, r0, n_rows, gt, ut, &bars[0], e);
  stage_chunks(a.x, hidden, xs);
  __syncthreads();
  stage_xsums(xs, n_chunks);
  __syncthreads();
  const int64_t row0 = r0 + warp * RPW;
  if (row0 >= ffn) return;
  if (!valid) {  // uniform over the block; no barrier follows
    if (lane == 0) {
      raise_device_error(err, kErrExpertIndex);
      for (int i = 0; i < RPW; ++i)
        if (row0 + i < ffn) a.act[j * ffn + row0 + i] = __int_as_float(0x7fc00000);
    }
    return;
  }
  const int gshift = __ffs(a.gate.group_size / kChunk) - 1;
  int lr[RPW];  // the warp's rows in the tiles (a row past the end reads the last one; its result is dropped)
#pragma unroll
  for (int i = 0; i < RPW; ++i) lr[i] = min(warp * RPW + i, n_rows - 1);
  float acc[R];
#pragma unroll
  for (int i = 0; i < R; ++i) acc[i] = 0.0f;
  auto x_of = [&](int) { return xs; };
  mbar_wait(&bars[0], 0);
  for (int s = 0; s < n_steps; ++s) {
    const int64_t c = lane + 32 * int64_t(s);
    if (c >= n_chunks) continue;
    const int64_t g = c >> gshift;
    uint32_t wd[R][BITS];
    float sc[R], bi[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const RowTile<BITS, ST>& t = i < RPW ? gt : ut;
      const int r = lr[i % RPW];
      t.load(r, c, wd[i]);
      sc[i] = t.scale(r, g);
      bi[i] = t.bias(r, g);
    }
    dot_step<BITS, R, true>(wd, sc, bi, c, x_of, acc);
  }
  write_act<ACT, RPW>(acc, a.act, j, ffn, row0, lane);
}

// Grid (ceil(hidden / kWarps)), a row per warp. Shared memory: barriers, k tiles of down rows (one per slot), the k
// act rows staged. out[r] = sum over j in order of weights[j] * (down[e_j][r] . act[j]), as fused_down_kernel.
template <int BITS, typename ST>
__global__ void __launch_bounds__(kThreads) fused_down_bulk_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t hidden = a.down.out, ffn = a.down.in, n_chunks = ffn / kChunk;
  const int64_t r0 = int64_t(blockIdx.x) * kWarps;
  const int n_rows = int(min64(kWarps, hidden - r0));
  const int64_t row_bytes = packed_row_bytes(ffn, BITS), srow = scale_row_bytes<ST>(ffn, a.down.group_size);
  const int64_t tile_full = RowTile<BITS, ST>::bytes(kWarps, row_bytes, srow);
  auto* bars = reinterpret_cast<uint64_t*>(smem4);
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4) + kBarBytes;
  float* xs = reinterpret_cast<float*>(base + a.k * tile_full);
  auto tile = [&](int sl) { return RowTile<BITS, ST>{base + sl * tile_full, row_bytes, srow, n_rows}; };
  if (threadIdx.x == 0) {
    for (int sl = 0; sl < a.k; ++sl) mbar_init(&bars[sl], 1);
  }
  __syncthreads();
  // The copies go out before the wait for kernel A: the indices come from the kernel before it, which had finished
  // when kernel A passed its wait and let this kernel start (read through L2).
  __shared__ int32_t experts[kMaxSlots];
  __shared__ float slot_weights[kMaxSlots];
  if (threadIdx.x < a.k) {  // lane sl issues slot sl's copies: the index loads are in flight together
    const int sl = threadIdx.x;
    const int32_t e = __ldcg(a.indices + sl);
    slot_weights[sl] = __ldcg(a.weights + sl);  // written with the indices
    experts[sl] = e;
    const bool ok = valid_expert(e, a.down.n_stack);
    mbar_arrive_expect(&bars[sl], ok ? unsigned(n_rows * (row_bytes + 2 * srow)) : 0u);
    if (ok) issue_rows(a.down, int64_t(e) * hidden + r0, n_rows, tile(sl), &bars[sl]);
  }
  // The residual row too: the residual stream was last written before the router ran. Loaded at the end (with the
  // routing weights) they were two more round trips on the critical path; with the act staged in one round trip
  // below, OLMoE tg128 went 1,296 -> 1,350 tok/s (H200; timeline in docs/benchmarks.md).
  const int64_t row = r0 + warp;
  const float res = a.residual && lane == 0 && row < hidden ? __ldcg(a.residual + row) : 0.0f;
  pdl_enter();
  stage_chunks<8>(a.act, a.k * ffn, xs);  // all of an OLMoE block's act loads in one round trip
  __syncthreads();
  stage_xsums(xs, a.k * n_chunks);
  __syncthreads();
  if (row >= hidden) return;
  const int gshift = __ffs(a.down.group_size / kChunk) - 1;
  const int lr = min(warp, n_rows - 1);
  // Every slot's rows were requested before the wait for kernel A, so they are waited for together, and kSlots slots
  // are computed at once: one slot at a time, each slot's chain of dependent FMAs and shuffles ran alone (the
  // barrier wait between slots kept the compiler from overlapping them). Slots are still added in order 0..k-1.
  for (int sl = 0; sl < a.k; ++sl) mbar_wait(&bars[sl], 0);
  constexpr int kSlots = 4;
  float out = 0.0f;
  for (int s0 = 0; s0 < a.k; s0 += kSlots) {
    auto x_of = [&](int i) { return xs + min(s0 + i, a.k - 1) * n_chunks * kChunkPad; };
    float acc[kSlots];
#pragma unroll
    for (int i = 0; i < kSlots; ++i) acc[i] = 0.0f;
    for (int64_t c = lane; c < n_chunks; c += 32) {
      uint32_t wd[kSlots][BITS];
      float sc[kSlots], bi[kSlots];
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        const RowTile<BITS, ST> t = tile(min(s0 + i, a.k - 1));  // a slot past k repeats the last; dropped below
        t.load(lr, c, wd[i]);
        sc[i] = t.scale(lr, c >> gshift);
        bi[i] = t.bias(lr, c >> gshift);
      }
      dot_step<BITS, kSlots>(wd, sc, bi, c, x_of, acc);
    }
#pragma unroll
    for (int i = 0; i < kSlots; ++i) acc[i] = warp_sum(acc[i]);
#pragma unroll
    for (int i = 0; i < kSlots; ++i) {
      const int sl = s0 + i;
      if (sl >= a.k) break;
      if (!valid_expert(experts[sl], a.down.n_stack)) {  // experts[] was written before the staging's barriers
        if (lane == 0 && row == 0) raise_device_error(err, kErrExpertIndex);
        out = __int_as_float(0x7fc00000);
      } else {
        out = fmaf(slot_weights[sl], acc[i], out);  // the gather path's weighted sum, same order
      }
    }
  }
  if (lane == 0) a.out[row] = a.residual ? res + out : out;
}

// Calls f.template operator()<BITS, ST>() for the weight's bits (4 or 8) and scale type.
template <class F>
void dispatch_bits_st(const WeightView& w, F&& f) {
  auto by_st = [&]<int BITS>() {
    switch (w.stype) {
      case FloatType::kF32: f.template operator()<BITS, float>(); break;
      case FloatType::kF16: f.template operator()<BITS, __half>(); break;
      case FloatType::kBF16: f.template operator()<BITS, __nv_bfloat16>(); break;
    }
  };
  if (w.bits == 4) {
    by_st.template operator()<4>();
  } else {
    by_st.template operator()<8>();
  }
}

}  // namespace

bool launch_fused_gate_up_bulk(const Ctx& ctx, const FusedMoeArgs& a) {
  const WeightView& g = a.gate;
  const int rpw = a.rows_per_warp;
  if (!a.bulk || (rpw != 1 && rpw != 2 && rpw != 4) || !bulk_rows_ok(g) || !bulk_rows_ok(a.up)) return false;
  // The tensor-core kernel A pays off where its compute per SM bounds it: OLMoE's 512 blocks (~4 per SM on the H200)
  // went 1,345 -> 1,385 tok/s, Qwen3-30B-A3B's 384 (~3 per SM) 382.3 -> 379.3 (docs/benchmarks.md, ninth tree).
  const int64_t blocks = (g.out + 15) / 16 * a.k;
  const bool mma = a.mma == 2 || (a.mma == 1 && blocks > 3 * int64_t(std::max(ctx.sm_count, 1)));
  if (mma && rpw == 2 && launch_gate_up_bulk_mma(ctx, a)) return true;
  const int64_t rows = int64_t(kWarps) * rpw;
  const int64_t row_bytes = packed_row_bytes(g.in, g.bits), srow = scale_row_bytes_of(g);
  const size_t smem =
      kBarBytes + 2 * size_t((rows * (row_bytes + 2 * srow) + 15) / 16 * 16) + staged_floats_bytes(g.in);
  if (smem > size_t(ctx.max_smem_optin)) return false;
  const dim3 grid{unsigned((g.out + rows - 1) / rows), unsigned(a.k)};
  dispatch_bits_st(g, [&]<int BITS, typename ST>() {
    auto by_act = [&]<int RPW>() {
      switch (a.glu) {
        case GluAct::kSiLU:
          launch_bulk(ctx, fused_gate_up_bulk_kernel<BITS, ST, GluAct::kSiLU, RPW>, grid, smem, a);
          break;
        case GluAct::kGeLU:
          launch_bulk(ctx, fused_gate_up_bulk_kernel<BITS, ST, GluAct::kGeLU, RPW>, grid, smem, a);
          break;
        case GluAct::kReLU2:
          launch_bulk(ctx, fused_gate_up_bulk_kernel<BITS, ST, GluAct::kReLU2, RPW>, grid, smem, a);
          break;
      }
    };
    if (rpw == 1) by_act.template operator()<1>();
    if (rpw == 2) by_act.template operator()<2>();
    if (rpw == 4) by_act.template operator()<4>();
  });
  return true;
}

bool launch_fused_down_bulk(const Ctx& ctx, const FusedMoeArgs& a) {
  const WeightView& d = a.down;
  if (!a.bulk || a.k > kMaxSlots || !bulk_rows_ok(d)) return false;
  if (a.mma != 0 && launch_down_bulk_mma(ctx, a)) return true;
  const int64_t row_bytes = packed_row_bytes(d.in, d.bits), srow = scale_row_bytes_of(d);
  const size_t tile = size_t((kWarps * (row_bytes + 2 * srow) + 15) / 16 * 16);
  const size_t smem = kBarBytes + size_t(a.k) * tile + staged_floats_bytes(int64_t(a.k) * d.in);
  if (smem > size_t(ctx.max_smem_optin)) return false;
  const dim3 grid{unsigned((d.out + kWarps - 1) / kWarps)};
  dispatch_bits_st(d,
                   [&]<int BITS, typename ST>() { launch_bulk(ctx, fused_down_bulk_kernel<BITS, ST>, grid, smem, a); });
  return true;
}

}  // namespace moecel::cuda
