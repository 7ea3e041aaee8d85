// Internal to the fused decode-MoE kernels fed by bulk copies (fused_moe_bulk.cu: CUDA cores; fused_moe_bulk_mma.cu:
// tensor cores): the block shape, the shared-memory tiles of weight rows and the copies that fill them.
#pragma once
#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/fused_moe.cuh"
#include "backend/cuda/fused_moe_dot.cuh"
#include "backend/cuda/qdot.cuh"

namespace moecel::cuda::bulk {

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

// The copies of rows [row, row + n) of w into `tile` from its row `first` (16-byte aligned offsets: first a multiple
// of 8), each passed to copy(src, dst, bytes): the rows are contiguous, so three copies (packed rows, scales, biases)
// move them all; a copy per row or per row segment measured slower (the copy unit's per-instruction cost, not the
// bytes, bounded it).
template <int BITS, typename ST, class Copy>
__device__ __forceinline__ void row_copies(const WeightView& w, int64_t row, int n, const RowTile<BITS, ST>& tile,
                                           int first, Copy copy) {
  const unsigned sb = unsigned(n * tile.srow_bytes);
  unsigned char* scales = tile.base + tile.n_rows * tile.row_bytes + first * tile.srow_bytes;
  copy(static_cast<const unsigned char*>(w.w) + row * tile.row_bytes, tile.base + first * tile.row_bytes,
       unsigned(n * tile.row_bytes));
  copy(static_cast<const unsigned char*>(w.scales) + row * tile.srow_bytes, scales, sb);
  copy(static_cast<const unsigned char*>(w.biases) + row * tile.srow_bytes, scales + tile.n_rows * tile.srow_bytes, sb);
}

// acc[i] += row lr[i] of a tile . the staged vector xs (with its chunk sums), the lane's chunks c = lane, lane + 32,
// ... in the matrix-vector kernels' order; the caller reduces acc over the warp. gshift: log2(group_size / kChunk).
template <int BITS, typename ST, int R>
__device__ __forceinline__ void tile_rows_dot(const RowTile<BITS, ST>& tile, const int (&lr)[R], int n_chunks,
                                              int gshift, const float* xs, int lane, float (&acc)[R]) {
  auto x_of = [&](int) { return xs; };
  for (int c = lane; c < n_chunks; c += 32) {  // 32-bit indices: a 64-bit one cost the loop a spilled register
    const int g = c >> gshift;
    uint32_t wd[R][BITS];
    float sc[R], bi[R];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      tile.load(lr[i], c, wd[i]);
      sc[i] = tile.scale(lr[i], g);
      bi[i] = tile.bias(lr[i], g);
    }
    dot_step<BITS, R, true>(wd, sc, bi, c, x_of, acc);
  }
}

// Issues row_copies, completing on `bar` (one thread).
template <int BITS, typename ST>
__device__ void issue_rows(const WeightView& w, int64_t row, int n, const RowTile<BITS, ST>& tile, uint64_t* bar,
                           int first = 0) {
  row_copies(w, row, n, tile, first, [&](const unsigned char* src, unsigned char* dst, unsigned bytes) {
    bulk_copy_once(dst, src, bytes, bar);
  });
}

// Whether a matrix's rows can be bulk-copied: 4 or 8 bits (packed rows a multiple of 16 bytes), 16-byte aligned
// scales and biases, and 8 rows of scales a multiple of 16 bytes. Every tile is a multiple of 8 rows starting at a row
// that is a multiple of 8 (ffn and hidden are multiples of 32), so each tile's scales and biases are one aligned
// span: Qwen3-30B-A3B's down projection (24-byte rows of scales) qualifies.
inline bool bulk_rows_ok(const WeightView& w) {
  const int64_t ssize = w.stype == FloatType::kF32 ? 4 : 2;
  return (w.bits == 4 || w.bits == 8) && 8 * (w.in / w.group_size) * ssize % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w.scales) % 16 == 0 && reinterpret_cast<uintptr_t>(w.biases) % 16 == 0;
}

inline int64_t scale_row_bytes_of(const WeightView& w) {
  return (w.in / w.group_size) * (w.stype == FloatType::kF32 ? 4 : 2);
}

// Octets o0 + u * kThreads + threadIdx.x (u < kOct) of an n_oct-octet vector into v[u], zeros past its end, all loads
// issued before any is used (load8(i, v) reads values i .. i + 7): a loop of load-then-store steps is a chain of L2
// round trips.
template <int kOct, class Load8>
__device__ __forceinline__ void load_octets(int64_t o0, int64_t n_oct, Load8 load8, float (&v)[kOct][8]) {
#pragma unroll
  for (int u = 0; u < kOct; ++u) {
    const int64_t o = o0 + u * kThreads + threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; ++i) v[u][i] = 0.0f;
    if (o < n_oct) load8(o * 8, v[u]);
  }
}

inline size_t staged_floats_bytes(int64_t n) {
  return size_t(n / kChunk) * kChunkPad * sizeof(float);
}

// a with the share of kernel B's down rows each of blocks_x kernel A blocks per slot requests into L2
// (FusedMoeArgs::l2_down): a multiple of 8 rows, so each span is 16-byte aligned as bulk_rows_ok guarantees; off where
// the down rows do not qualify or a span would not fit the copy's 32-bit size.
inline FusedMoeArgs with_down_share(FusedMoeArgs a, int64_t blocks_x) {
  const int64_t per = ((a.down.out + blocks_x - 1) / blocks_x + 7) / 8 * 8;
  const int64_t row_bytes = packed_row_bytes(a.down.in, a.down.bits), srow = scale_row_bytes_of(a.down);
  if (!bulk_rows_ok(a.down) || per * row_bytes >= (int64_t(1) << 31) || a.down.out >= (int64_t(1) << 31)) {
    a.l2_down = false;
  }
  a.l2_rows = int(per);
  a.l2_row_bytes = int(row_bytes);
  a.l2_srow = int(srow);
  return a;
}

template <class Kernel>
void launch_bulk(const Ctx& ctx, Kernel kernel, dim3 grid, size_t smem, const FusedMoeArgs& a) {
  launch_k(ctx, kernel, grid, kThreads, smem, a, ctx.error_flag);
}

// Kernel A's request of kernel B's down rows of expert e into L2: block x's share, rows [x, x + 1) * a.l2_rows, three
// requests by one thread.
__device__ __forceinline__ void prefetch_down_share(const FusedMoeArgs& a, int32_t e) {
  const WeightView& d = a.down;
  const int first = int(blockIdx.x) * a.l2_rows, n = min(a.l2_rows, int(d.out) - first);
  if (unsigned(e) >= unsigned(d.n_stack) || n <= 0) return;
  const int64_t row = int64_t(e) * d.out + first;
  bulk_prefetch_l2(static_cast<const unsigned char*>(d.w) + row * a.l2_row_bytes, unsigned(n * a.l2_row_bytes));
  bulk_prefetch_l2(static_cast<const unsigned char*>(d.scales) + row * a.l2_srow, unsigned(n * a.l2_srow));
  bulk_prefetch_l2(static_cast<const unsigned char*>(d.biases) + row * a.l2_srow, unsigned(n * a.l2_srow));
}

// Kernel A's start: initializes the block's barriers, waits for the kernels before (the indices and x come from
// them), reads slot j's expert and has thread 0 issue the copies of its n gate and up rows from row r0 into gt and
// ut, all completing on bar[0]; with up_later only gate's, and issue_up issues up's on bar[1] once gate's have landed.
// Every thread calls it; returns whether the expert index is valid (uniform over the block) and sets `e` to it: kept in
// a register, so that the later copies need no second load of it (an L2 round trip on warp 0's path to its MMAs).
template <int BITS, typename ST>
__device__ __forceinline__ bool gate_up_prologue(const FusedMoeArgs& a, int j, int64_t r0, int n,
                                                 const RowTile<BITS, ST>& gt, const RowTile<BITS, ST>& ut,
                                                 uint64_t* bar, int32_t& e, bool up_later = false) {
  if (threadIdx.x < 2) mbar_init(bar + threadIdx.x, 1);
  __syncthreads();
  pdl_enter();
  e = a.indices[j];
  const bool valid = e >= 0 && e < a.gate.n_stack;
  if (threadIdx.x == 0 && valid) {
    const unsigned bytes = unsigned(n * (gt.row_bytes + 2 * gt.srow_bytes));
    const int64_t row = int64_t(e) * a.gate.out + r0;
    mbar_arrive_expect(bar, up_later ? bytes : 2 * bytes);
    issue_rows(a.gate, row, n, gt, bar);
    if (!up_later) issue_rows(a.up, row, n, ut, bar);
  }
  return valid;
}

// The up rows' copies of gate_up_prologue with up_later (thread 0, once bar[0] has completed; e: its expert).
template <int BITS, typename ST>
__device__ __forceinline__ void issue_up(const FusedMoeArgs& a, int32_t e, int64_t r0, int n,
                                         const RowTile<BITS, ST>& ut, uint64_t* bar) {
  mbar_arrive_expect(bar + 1, unsigned(n * (ut.row_bytes + 2 * ut.srow_bytes)));
  issue_rows(a.up, int64_t(e) * a.up.out + r0, n, ut, bar + 1);
}

// The tensor-core kernels A and B (fused_moe_bulk_mma.cu) where they apply (4-/8-bit weights, group size 32, 64 or
// 128, 16-row tiles); false, launching nothing, otherwise.
// With a.route set, only the int8 variants with the route (FusedMoeArgs::route); dry: only whether they would launch.
bool launch_gate_up_bulk_mma(const Ctx& ctx, const FusedMoeArgs& a, bool dry = false);
bool launch_down_bulk_mma(const Ctx& ctx, const FusedMoeArgs& a, bool dry = false);

}  // namespace moecel::cuda::bulk
