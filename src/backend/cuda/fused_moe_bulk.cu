// Fused decode-MoE kernels A and B fed by bulk copies (bulk_copy.cuh): each block puts all of its weight rows,
// scales and biases in flight at once into shared memory, a few copy instructions issued by one warp, and computes
// from there. The register-prefetch kernels (fused_moe.cu) hold at most two chunk steps per row in registers, which
// took ~125 registers per thread, two blocks per SM and two waves for kernel A. The arithmetic is dot_step's, in
// the same chunk and slot order, so results are bit for bit those of the other kernels and of the gather path.
// Kernel B issues its copies before waiting for kernel A (the expert indices come from an earlier kernel) and
// waits per slot.
#include <algorithm>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/fused_moe.cuh"
#include "backend/cuda/fused_moe_dot.cuh"
#include "backend/cuda/gemv_mma.cuh"

namespace moecel::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxSlots = 16;  // kernel B: one barrier per selected expert
constexpr size_t kBarBytes = 128;

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// Bytes of one row of packed weights for `in` values, and of its scales (or biases).
__host__ __device__ constexpr int64_t packed_row_bytes(int64_t in, int bits) {
  return in / kChunk * bits * 4;
}

template <typename ST>
__host__ __device__ constexpr int64_t scale_row_bytes(int64_t in, int64_t group_size) {
  return in / group_size * int64_t(sizeof(ST));
}

// Shared memory of one matrix's rows in a block: packed rows, then their scales, then their biases.
template <int BITS, typename ST>
struct RowTile {
  unsigned char* base;
  int64_t row_bytes, srow_bytes;
  int n_rows;
  // The BITS packed words of chunk c of row r (16-byte aligned: BITS is 4 or 8).
  __device__ void load(int r, int64_t c, uint32_t (&wd)[BITS]) const {
    const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const uint32_t*>(base + r * row_bytes) + c * BITS);
#pragma unroll
    for (int v = 0; v < BITS / 4; ++v) {
      const uint4 q = p[v];
      wd[4 * v] = q.x;
      wd[4 * v + 1] = q.y;
      wd[4 * v + 2] = q.z;
      wd[4 * v + 3] = q.w;
    }
  }
  __device__ float scale(int r, int64_t g) const {
    return to_f32(reinterpret_cast<const ST*>(base + n_rows * row_bytes + r * srow_bytes)[g]);
  }
  __device__ float bias(int r, int64_t g) const {
    return to_f32(reinterpret_cast<const ST*>(base + n_rows * (row_bytes + srow_bytes) + r * srow_bytes)[g]);
  }
  static __host__ __device__ int64_t bytes(int n_rows, int64_t row_bytes, int64_t srow_bytes) {
    return (n_rows * (row_bytes + 2 * srow_bytes) + 15) / 16 * 16;
  }
};

// Lane 0 of a warp issues the copies of rows [row, row + n) of w into `tile`, completing on `bar`: the rows are
// contiguous, so three copies (packed rows, scales, biases) move them all; a copy per row or per row segment
// measured slower (the copy unit's per-instruction cost, not the bytes, bounded it).
template <int BITS, typename ST>
__device__ void issue_rows(const WeightView& w, int64_t row, int n, const RowTile<BITS, ST>& tile, uint64_t* bar) {
  bulk_copy(tile.base, static_cast<const unsigned char*>(w.w) + row * tile.row_bytes, unsigned(n * tile.row_bytes),
            bar);
  const unsigned sb = unsigned(n * tile.srow_bytes);
  bulk_copy(tile.base + n * tile.row_bytes, static_cast<const unsigned char*>(w.scales) + row * tile.srow_bytes, sb,
            bar);
  bulk_copy(tile.base + n * (tile.row_bytes + tile.srow_bytes),
            static_cast<const unsigned char*>(w.biases) + row * tile.srow_bytes, sb, bar);
}

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
  if (threadIdx.x == 0) mbar_init(&bars[0], 1);
  __syncthreads();
  pdl_enter();  // the indices and x come from the kernels before
  const int32_t e = a.indices[j];
  const bool valid = valid_expert(e, a.gate.n_stack);
  if (threadIdx.x == 0 && valid) {
    mbar_arrive_expect(&bars[0], unsigned(2 * n_rows * (row_bytes + 2 * srow)));
    issue_rows(a.gate, int64_t(e) * ffn + r0, n_rows, gt, &bars[0]);
    issue_rows(a.up, int64_t(e) * ffn + r0, n_rows, ut, &bars[0]);
  }
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

// Kernel A on tensor cores (FusedMoeArgs::mma_a): the same grid, copies and result as fused_gate_up_bulk_kernel with
// two rows per warp, i.e. 16 gate and 16 up rows per block, but each 16-row tile is one m16n8k16 A operand and x the
// B operand in three bf16 terms (gemv_mma.cuh: centered codes, exact products, each group's MMAs folded with f32
// fmas). Warp w takes groups w, w + 8, ... of both tiles and the block adds the warps' partial sums in warp order.
// The CUDA-core loop spent ~3.5 instructions per weight and kept kernel A issue-bound after its rows had landed;
// here unpacking costs ~1.5 per weight per lane group and the MMA does the multiply-adds.
// Shared memory: barriers, the gate tile, the up tile, x's three planes, x's group sums, the warps' partial sums.
template <int BITS, int GS, typename ST, GluAct ACT>
__global__ void __launch_bounds__(kThreads, min_blocks(2))
    fused_gate_up_bulk_mma_kernel(FusedMoeArgs a, unsigned* err) {
  extern __shared__ float4 smem4[];
  constexpr int kRows = kMmaTileRows;              // rows of each matrix in this block
  constexpr int kBlocks = GS / 32;                 // 32-value blocks per group
  constexpr int kGroupBytes = GS * BITS / 8;       // one row's packed group
  constexpr int kWords = kBlocks * BITS / 4;       // a lane's words of one row's group
  constexpr float kZero = float(1 << (BITS - 1));  // the code center q4_pair / q8_pair subtract
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, j = blockIdx.y;
  const int gid = lane >> 2, t = lane & 3;
  const int64_t ffn = a.gate.out, hidden = a.gate.in, groups = hidden / GS;
  const int64_t r0 = int64_t(blockIdx.x) * kRows;
  const int64_t row_bytes = packed_row_bytes(hidden, BITS), srow = scale_row_bytes<ST>(hidden, GS);
  const int64_t tile_bytes = RowTile<BITS, ST>::bytes(kRows, row_bytes, srow), plane = mma_plane_bytes(hidden);
  auto* bars = reinterpret_cast<uint64_t*>(smem4);
  unsigned char* base = reinterpret_cast<unsigned char*>(smem4) + kBarBytes;
  const RowTile<BITS, ST> tiles[2] = {{base, row_bytes, srow, kRows}, {base + tile_bytes, row_bytes, srow, kRows}};
  unsigned char* planes = base + 2 * tile_bytes;
  float* xsum = reinterpret_cast<float*>(planes + 3 * plane);
  float* part = xsum + (groups + 3) / 4 * 4;  // (kWarps, 2 * kRows)
  if (threadIdx.x == 0) mbar_init(&bars[0], 1);
  __syncthreads();
  pdl_enter();  // the indices and x come from the kernels before
  const int32_t e = a.indices[j];
  const bool valid = valid_expert(e, a.gate.n_stack);
  if (threadIdx.x == 0 && valid) {
    mbar_arrive_expect(&bars[0], unsigned(2 * kRows * (row_bytes + 2 * srow)));
    issue_rows(a.gate, int64_t(e) * ffn + r0, kRows, tiles[0], &bars[0]);
    issue_rows(a.up, int64_t(e) * ffn + r0, kRows, tiles[1], &bars[0]);
  }
  const bool vec = (reinterpret_cast<uintptr_t>(a.x) & 15) == 0;
  mma_stage<GS>(
      hidden, [&](int64_t i, float(&v)[8]) { load8_global(a.x + i, vec, v); }, planes, xsum);
  __syncthreads();
  if (!valid) {  // uniform over the block; no barrier follows
    if (threadIdx.x == 0) raise_device_error(err, kErrExpertIndex);
    if (threadIdx.x < kRows) a.act[j * ffn + r0 + threadIdx.x] = __int_as_float(0x7fc00000);
    return;
  }
  // Lane (gid, t) loads x's B fragments from plane gid (hi, mid, lo; lanes with gid >= 3 hold zero columns).
  const unsigned char* bp = planes + (gid < 3 ? gid : 0) * plane + t * 16;
  float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [tile][row gid, row gid + 8]
  mbar_wait(&bars[0], 0);
  for (int64_t g = warp; g < groups; g += kWarps) {
    uint32_t w[2][2][kWords];  // [tile][row gid, gid + 8][word]
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        lds_words(tiles[m].base + (gid + 8 * h) * row_bytes + g * kGroupBytes + t * (kGroupBytes / 4), w[m][h]);
      }
    }
    float d[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int p = 0; p < kBlocks; ++p) {
      uint4 bx = make_uint4(0u, 0u, 0u, 0u);
      if (gid < 3) bx = *reinterpret_cast<const uint4*>(bp + (g * kBlocks + p) * 64);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        uint32_t q[2][4];
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
          if constexpr (BITS == 4) {
            q[ks][0] = q4_pair(w[m][0][p], 2 * ks);
            q[ks][1] = q4_pair(w[m][1][p], 2 * ks);
            q[ks][2] = q4_pair(w[m][0][p], 2 * ks + 1);
            q[ks][3] = q4_pair(w[m][1][p], 2 * ks + 1);
          } else {
            q[ks][0] = q8_pair(w[m][0][2 * p], w[m][0][2 * p + 1], 2 * ks);
            q[ks][1] = q8_pair(w[m][1][2 * p], w[m][1][2 * p + 1], 2 * ks);
            q[ks][2] = q8_pair(w[m][0][2 * p], w[m][0][2 * p + 1], 2 * ks + 1);
            q[ks][3] = q8_pair(w[m][1][2 * p], w[m][1][2 * p + 1], 2 * ks + 1);
          }
        }
        mma_bf16(d[m], q[0], bx.x, bx.y);
        mma_bf16(d[m], q[1], bx.z, bx.w);
      }
    }
    // Lane t == 0 holds columns 0, 1 (hi, mid), t == 1 columns 2, 3 (lo, 0); the bias term is added once, by t == 0.
    const float xs = t == 0 ? xsum[g] : 0.0f;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const float s0 = tiles[m].scale(gid, g), s1 = tiles[m].scale(gid + 8, g);
      const float b0 = fmaf(kZero, s0, tiles[m].bias(gid, g)), b1 = fmaf(kZero, s1, tiles[m].bias(gid + 8, g));
      acc[m][0] = fmaf(s0, d[m][0] + d[m][1], fmaf(b0, xs, acc[m][0]));
      acc[m][1] = fmaf(s1, d[m][2] + d[m][3], fmaf(b1, xs, acc[m][1]));
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

// Whether a matrix's rows can be bulk-copied: 4 or 8 bits (packed rows a multiple of 16 bytes) and rows of scales
// a multiple of 16 bytes, 16-byte aligned (so every row's scales and biases start aligned).
bool bulk_rows_ok(const WeightView& w) {
  const int64_t ssize = w.stype == FloatType::kF32 ? 4 : 2;
  return (w.bits == 4 || w.bits == 8) && (w.in / w.group_size) * ssize % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.scales) % 16 == 0 && reinterpret_cast<uintptr_t>(w.biases) % 16 == 0;
}

int64_t scale_row_bytes_of(const WeightView& w) {
  return (w.in / w.group_size) * (w.stype == FloatType::kF32 ? 4 : 2);
}

size_t staged_floats_bytes(int64_t n) {
  return size_t(n / kChunk) * kChunkPad * sizeof(float);
}

template <class Kernel>
void launch_bulk(const Ctx& ctx, Kernel kernel, dim3 grid, size_t smem, const FusedMoeArgs& a) {
  launch_k(ctx, kernel, grid, kThreads, smem, a, ctx.error_flag);
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

// The tensor-core kernel A for 4-/8-bit experts with group size 32, 64 or 128 and ffn a multiple of its 16-row tiles;
// false (launching nothing) otherwise.
bool launch_gate_up_mma(const Ctx& ctx, const FusedMoeArgs& a) {
  const WeightView& g = a.gate;
  const int gs = int(g.group_size);
  if (g.out % kMmaTileRows != 0 || (gs != 32 && gs != 64 && gs != 128) || g.in % gs != 0) return false;
  const int64_t row_bytes = packed_row_bytes(g.in, g.bits), srow = scale_row_bytes_of(g);
  const int64_t groups = g.in / gs;
  const size_t smem = kBarBytes + 2 * size_t((kMmaTileRows * (row_bytes + 2 * srow) + 15) / 16 * 16) +
                      3 * size_t(mma_plane_bytes(g.in)) + size_t((groups + 3) / 4 * 4) * sizeof(float) +
                      size_t(kWarps) * 2 * kMmaTileRows * sizeof(float);
  if (smem > size_t(ctx.max_smem_optin)) return false;
  const dim3 grid{unsigned(g.out / kMmaTileRows), unsigned(a.k)};
  dispatch(g, [&]<int BITS, int GS, typename ST>() {
    switch (a.glu) {
      case GluAct::kSiLU:
        launch_bulk(ctx, fused_gate_up_bulk_mma_kernel<BITS, GS, ST, GluAct::kSiLU>, grid, smem, a);
        break;
      case GluAct::kGeLU:
        launch_bulk(ctx, fused_gate_up_bulk_mma_kernel<BITS, GS, ST, GluAct::kGeLU>, grid, smem, a);
        break;
      case GluAct::kReLU2:
        launch_bulk(ctx, fused_gate_up_bulk_mma_kernel<BITS, GS, ST, GluAct::kReLU2>, grid, smem, a);
        break;
    }
  });
  return true;
}

}  // namespace

bool launch_fused_gate_up_bulk(const Ctx& ctx, const FusedMoeArgs& a) {
  const WeightView& g = a.gate;
  const int rpw = a.rows_per_warp;
  if (!a.bulk || (rpw != 1 && rpw != 2 && rpw != 4) || !bulk_rows_ok(g) || !bulk_rows_ok(a.up)) return false;
  if (a.mma_a && rpw == 2 && launch_gate_up_mma(ctx, a)) return true;
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
