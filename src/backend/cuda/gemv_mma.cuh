// Tensor-core building blocks of the decode matrix-vector kernels (qgemv_mma.cu, fused_moe_mma.cu) for 4- and
// 8-bit MLX affine weights with group size 32, 64 or 128. Opt-in (MOECEL_CUDA_DECODE_MMA=1): on the H200 they are
// still slower than the CUDA-core kernels (docs/benchmarks.md has the figures and where the time goes).
//
// Why: the CUDA-core kernels spend ~12 instructions per 4-bit weight (unpack, convert, fma) and issue at about
// half the SM's rate, which bounds them well below DRAM bandwidth. Here a warp computes 16 output rows at once
// with mma.sync m16n8k16: the weight rows are the A operand (centered codes, ~1.4 instructions per weight to
// unpack) and x is the B operand, split into three bf16 terms (hi, mid, lo) in columns 0-2, so one MMA multiplies
// by the f32 x exactly (the precision argument of qgemm_mma.cu). Columns 3-7 are zero.
//
// Work unit (a task): one tile of 16 rows x one slice of kMmaSlice values of `in`. Within a task each group's
// MMAs start from zero (short chains: tensor cores truncate their f32 sums) and are folded with f32 fmas:
//   acc += s * sum((q - z) x) + (b + z s) * sum(x).
// A row's dot product is its slices' partial sums added in slice order. Every kernel that uses these functions
// produces the same value for a row, whichever warp or block computes which task: the fused decode-MoE path
// stays bit-for-bit equal to the gather path. Each warp streams its tasks' weights (packed words, scales,
// biases) through a ring of shared-memory stages with cp.async (pipeline()).
//
// Fragment order (see qgemm_mma.cu): lane (gid = lane / 4, t = lane % 4) holds rows gid and gid + 8; within a
// group, lane t owns the group's values [t * gs / 4, (t + 1) * gs / 4), i.e. 32-value blocks p = 0 .. gs/32 - 1 of
// 8 consecutive values each, taken in the order (k0, k4), (k1, k5) for the first k16 step and (k2, k6), (k3, k7)
// for the second. For 4-bit weights those 8 values are one packed word, so a lane reads gs / 8 contiguous bytes
// per row and group from its stage. x is staged in the same order: a 16-byte slot per (group, block p, lane t)
// and plane (hi, mid, lo).
#pragma once
#include <cstdint>
#include <type_traits>
#include <utility>

#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/qdot.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {

constexpr int kMmaSlice = 256;    // values of `in` per task
constexpr int kMmaTileRows = 16;  // output rows per task

// Bytes of one bf16 plane of an n-value vector (n % 32 == 0): the plane stride is 64 mod 128 bytes, so the
// 16-byte B-fragment loads of planes 0 and 1 (one 8-lane phase) fall in distinct banks.
__host__ __device__ constexpr int64_t mma_plane_bytes(int64_t n) {
  return 2 * n + ((2 * n) % 128 == 0 ? 64 : 0);
}

// Sum of an octet of values in the order every staging of a vector uses.
__device__ __forceinline__ float octet_sum(const float (&v)[8]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Stores values i .. i + 7 (i % 8 == 0) of a vector as the B operand for group size 1 << gshift: their 16-byte
// slots of the three bf16 planes (plane stride mma_plane_bytes(n)).
__device__ __forceinline__ void mma_put_octet(unsigned char* planes, int64_t plane, int gshift, int64_t i,
                                              const float (&v)[8]) {
  const int64_t g = i >> gshift;
  const int kl = int(i & ((int64_t(1) << gshift) - 1));                         // offset in the group
  const int t = kl >> (gshift - 2), p = (kl & ((1 << (gshift - 2)) - 1)) >> 3;  // owning lane, 32-value block
  uint32_t h[4], m[4], l[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) split3(v[j], v[j + 4], h[j], m[j], l[j]);
  unsigned char* dst = planes + ((g * (1 << (gshift - 5)) + p) * 4 + t) * 16;
  *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);
  *reinterpret_cast<uint4*>(dst + plane) = make_uint4(m[0], m[1], m[2], m[3]);
  *reinterpret_cast<uint4*>(dst + 2 * plane) = make_uint4(l[0], l[1], l[2], l[3]);
}

// A group's sum of x from its octet sums s[0 .. n) (n a power of two): the pairwise order of mma_stage's
// butterfly, so a vector staged from octet sums gets the same group sums bit for bit.
__device__ __forceinline__ float group_sum_of_octets(const float* s, int n) {
  float t[16];
  for (int i = 0; i < n; ++i) t[i] = s[i];
  for (int w = 1; w < n; w *= 2) {
    for (int i = 0; i < n; i += 2 * w) t[i] = t[i] + t[i + w];
  }
  return t[0];
}

// Stages n values (n % gs == 0) as the B operand: three bf16 planes of mma_plane_bytes(n) bytes at `planes`, and
// xsum[g] = sum of group g's values in f32 (a fixed order). load8(i, v) reads values i .. i + 7. Every thread of
// the block calls it (blockDim.x a multiple of 32); the caller synchronizes before the planes are read.
template <int GS, class Load8>
__device__ __forceinline__ void mma_stage(int64_t n, Load8 load8, unsigned char* planes, float* xsum) {
  constexpr int kOctPerGroup = GS / 8, kShift = GS == 32 ? 5 : GS == 64 ? 6 : 7;
  const int64_t n_oct = n / 8, plane = mma_plane_bytes(n);
  for (int64_t o0 = 0; o0 < n_oct; o0 += blockDim.x) {  // uniform trip count: the shuffles need every lane
    const int64_t o = o0 + threadIdx.x;
    float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (o < n_oct) {
      load8(o * 8, v);
      mma_put_octet(planes, plane, kShift, o * 8, v);
    }
    // A group's octets are kOctPerGroup consecutive lanes of one warp (o0 is a multiple of 32).
    float s = octet_sum(v);
#pragma unroll
    for (int off = 1; off < kOctPerGroup; off <<= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (o < n_oct && o % kOctPerGroup == 0) xsum[o / kOctPerGroup] = s;
  }
}

// mma_stage of n values already staged in shared memory in the padded chunk layout (stage_chunks: 16-byte aligned
// chunks, so an octet is two float4 loads within one chunk).
template <int GS>
__device__ __forceinline__ void mma_stage_chunks(int64_t n, const float* xs, unsigned char* planes, float* xsum) {
  mma_stage<GS>(
      n,
      [&](int64_t i, float(&v)[8]) {
        const float* src = xs + (i / kChunk) * kChunkPad + i % kChunk;
        const float4 lo = reinterpret_cast<const float4*>(src)[0];
        const float4 hi = reinterpret_cast<const float4*>(src)[1];
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
        v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
      },
      planes, xsum);
}

// Eight consecutive f32 from global memory (16-byte aligned when `vec`).
__device__ __forceinline__ void load8_global(const float* p, bool vec, float (&v)[8]) {
  if (vec) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = p[j];
  }
}

// One task's weights in shared memory: a stage of a warp's cp.async ring. 16 rows of the slice's packed words
// (rows padded so that the lanes' fragment loads hit distinct banks), then the rows' scales and biases.
template <int BITS, int GS, typename ST>
struct MmaStage {
  static constexpr int kGroups = kMmaSlice / GS;                 // 8, 4, 2
  static constexpr int kBlocks = GS / 32;                        // 32-value blocks per group
  static constexpr int kWords = kBlocks * BITS / 4;              // words per lane, row and group
  static constexpr int kGroupBytes = GS * BITS / 8;              // bytes of one row's group
  static constexpr int kRowBytes = kMmaSlice * BITS / 8;         // 128 or 256
  static constexpr int kRowStride = kRowBytes + 8 * BITS;        // + 32 / 64 bytes
  static constexpr int kScaleBytes = kGroups * int(sizeof(ST));  // one row's scales (or biases)
  static constexpr int kScales = kMmaTileRows * kRowStride;
  static constexpr int kBiases = kScales + kMmaTileRows * kScaleBytes;
  static constexpr int kBytes = (kBiases + kMmaTileRows * kScaleBytes + 15) / 16 * 16;
};

// Where a task's rows come from: rows row0 .. row0 + 15 (clamped to last_row; a clamped row's result is dropped)
// of a weight with row_bytes packed bytes and `groups` scales per row; slice `slice` of each row.
template <typename ST>
struct TaskSrc {
  const unsigned char* w;
  const ST* s;
  const ST* b;  // may be null: zero biases
  int64_t row0, last_row, row_bytes, groups;
  int slice;
};

// Whether the scales of a weight can be copied 4 bytes at a time (every row and slice start 4-byte aligned).
__host__ __device__ constexpr bool mma_scales_aligned(int64_t groups, int gs, int scale_bytes) {
  return (groups * scale_bytes) % 4 == 0 && ((kMmaSlice / gs) * scale_bytes) % 4 == 0;
}

// Issues the copies of a task into `stage` (the caller commits the group). Values past the row's groups are
// zero-filled and never read as data.
template <int BITS, int GS, typename ST>
__device__ __forceinline__ void mma_issue(unsigned char* stage, const TaskSrc<ST>& src, int lane) {
  using L = MmaStage<BITS, GS, ST>;
  const int64_t g0 = int64_t(src.slice) * L::kGroups;
  const int ng = int(min(int64_t(L::kGroups), src.groups - g0));
  constexpr int kChunks = L::kRowBytes / 16;  // 16-byte chunks per row: 8 lanes read one row's 128 bytes
  constexpr int kRowsPerPass = 32 / kChunks;  // rows one pass of the warp covers
  const int col = lane % kChunks;
  const bool valid = col * 16 / L::kGroupBytes < ng;              // a chunk never straddles a group (group >= 16 bytes)
  const bool clamp = src.row0 + kMmaTileRows - 1 > src.last_row;  // only the weight's last tile
  const unsigned char* g = src.w + (src.row0 + lane / kChunks) * src.row_bytes + g0 * L::kGroupBytes + col * 16;
  const uint32_t d = smem_addr(stage + (lane / kChunks) * L::kRowStride + col * 16);
  const int64_t step = kRowsPerPass * src.row_bytes;
  if (!clamp) {
#pragma unroll
    for (int pass = 0; pass < kMmaTileRows / kRowsPerPass; ++pass) {
      cp_async16(d + pass * kRowsPerPass * L::kRowStride, valid ? g + pass * step : src.w, valid);
    }
  } else {
#pragma unroll
    for (int pass = 0; pass < kMmaTileRows / kRowsPerPass; ++pass) {
      const int64_t over = src.row0 + lane / kChunks + pass * kRowsPerPass - src.last_row;
      const unsigned char* gp = g + pass * step - (over > 0 ? over * src.row_bytes : 0);  // clamped: result dropped
      cp_async16(d + pass * kRowsPerPass * L::kRowStride, valid ? gp : src.w, valid);
    }
  }
  constexpr int kUnits = L::kScaleBytes / 4, kPer = 4 / int(sizeof(ST)) > 0 ? 4 / int(sizeof(ST)) : 1;
#pragma unroll
  for (int c = lane; c < 2 * kMmaTileRows * kUnits; c += 32) {
    const int which = c / (kMmaTileRows * kUnits), row = (c / kUnits) % kMmaTileRows, u = c % kUnits;
    const ST* base = which ? src.b : src.s;
    const bool ok = u * kPer < ng && base != nullptr;
    const int64_t r = clamp ? min(src.row0 + row, src.last_row) : src.row0 + row;
    const ST* gs = ok ? base + r * src.groups + g0 + u * kPer : src.s;
    cp_async4(smem_addr(stage + (which ? L::kBiases : L::kScales) + row * L::kScaleBytes + u * 4), gs, ok);
  }
}

template <int N>
__device__ __forceinline__ void lds_words(const unsigned char* p, uint32_t (&w)[N]) {
  if constexpr (N == 1) {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  } else if constexpr (N == 2) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    w[0] = u.x, w[1] = u.y;
  } else {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const uint4 u = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = u.x, w[4 * i + 1] = u.y, w[4 * i + 2] = u.z, w[4 * i + 3] = u.w;
    }
  }
}

// Element i (compile-time after unrolling) of F32/F16/BF16 values packed into 32-bit words, as f32.
template <typename ST, int N>
__device__ __forceinline__ float packed_at(const uint32_t (&raw)[N], int i) {
  if constexpr (sizeof(ST) == 4) {
    return __uint_as_float(raw[i]);
  } else {
    const unsigned short h = static_cast<unsigned short>((i & 1) ? raw[i >> 1] >> 16 : raw[i >> 1] & 0xFFFFu);
    if constexpr (std::is_same_v<ST, __half>) {
      return __half2float(__ushort_as_half(h));
    } else {
      return __bfloat162float(__ushort_as_bfloat16(h));
    }
  }
}

// What the codes block_frags unpacks stand for, less the code: 4-bit codes come as 128 + q, 8-bit ones as q - 128.
// A group's sum is then s * sum(code x) + (b - kFoldZero s) * sum(x).
template <int BITS>
constexpr float kFoldZero = BITS == 4 ? 128.0f : -128.0f;

// The A fragments of 32-value block p of a lane's words of rows gid (w0) and gid + 8 (w1), for its two k16 steps
// (the fragment order in the file comment).
template <int BITS, int N>
__device__ __forceinline__ void block_frags(const uint32_t (&w0)[N], const uint32_t (&w1)[N], int p,
                                            uint32_t (&a)[2][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    if constexpr (BITS == 4) {
      a[ks][0] = q4_raw_pair(w0[p], 2 * ks);
      a[ks][1] = q4_raw_pair(w1[p], 2 * ks);
      a[ks][2] = q4_raw_pair(w0[p], 2 * ks + 1);
      a[ks][3] = q4_raw_pair(w1[p], 2 * ks + 1);
    } else {
      a[ks][0] = q8_pair(w0[2 * p], w0[2 * p + 1], 2 * ks);
      a[ks][1] = q8_pair(w1[2 * p], w1[2 * p + 1], 2 * ks);
      a[ks][2] = q8_pair(w0[2 * p], w0[2 * p + 1], 2 * ks + 1);
      a[ks][3] = q8_pair(w1[2 * p], w1[2 * p + 1], 2 * ks + 1);
    }
  }
}

// A task's partial dot products of rows gid and gid + 8 (the stage's rows), returned to lane t == 0 of each row
// group (other lanes' values must be ignored). planes / xsum: the staged vector (mma_stage); slice, groups: as
// in the TaskSrc the stage was issued from.
template <int BITS, int GS, typename ST>
__device__ __forceinline__ void mma_compute(const unsigned char* stage, int slice, int64_t groups,
                                            const unsigned char* planes, int64_t plane_bytes, const float* xsum,
                                            int lane, float& row0, float& row1) {
  using L = MmaStage<BITS, GS, ST>;
  constexpr float kZero = -kFoldZero<BITS>;
  const int n = lane >> 2, t = lane & 3, gid = lane >> 2;
  const int g0 = slice * L::kGroups, ng = int(min(int64_t(L::kGroups), groups - g0));
  const unsigned char* bp = planes + (n < 3 ? n : 0) * plane_bytes + t * 16;
  uint32_t sc[2][L::kScaleBytes / 4], bi[2][L::kScaleBytes / 4];  // the rows' scales and biases, one load each
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lds_words(stage + L::kScales + (gid + 8 * h) * L::kScaleBytes, sc[h]);
    lds_words(stage + L::kBiases + (gid + 8 * h) * L::kScaleBytes, bi[h]);
  }
  float acc0 = 0.0f, acc1 = 0.0f;
  auto group = [&](int gi) {
    const int g = g0 + gi;
    uint32_t w[2][L::kWords];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lds_words(stage + (gid + 8 * h) * L::kRowStride + gi * L::kGroupBytes + t * (L::kGroupBytes / 4), w[h]);
    }
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int p = 0; p < L::kBlocks; ++p) {
      uint4 bx = make_uint4(0u, 0u, 0u, 0u);
      if (n < 3) bx = *reinterpret_cast<const uint4*>(bp + (g * L::kBlocks + p) * 64);
      uint32_t a[2][4];
      block_frags<BITS>(w[0], w[1], p, a);
      mma_bf16(d, a[0], bx.x, bx.y);
      mma_bf16(d, a[1], bx.z, bx.w);
    }
    // Lane t == 0 holds columns 0, 1 (hi, mid), t == 1 columns 2, 3 (lo, 0); the bias term is added once, by t == 0.
    const float xs = t == 0 ? xsum[g] : 0.0f;
    const float s0 = packed_at<ST>(sc[0], gi), s1 = packed_at<ST>(sc[1], gi);
    const float b0 = fmaf(kZero, s0, packed_at<ST>(bi[0], gi)), b1 = fmaf(kZero, s1, packed_at<ST>(bi[1], gi));
    acc0 = fmaf(s0, d[0] + d[1], fmaf(b0, xs, acc0));
    acc1 = fmaf(s1, d[2] + d[3], fmaf(b1, xs, acc1));
  };
  if (ng == L::kGroups) {  // every slice but a short last one: no per-group guards in the unrolled code
#pragma unroll
    for (int gi = 0; gi < L::kGroups; ++gi) group(gi);
  } else {
#pragma unroll
    for (int gi = 0; gi < L::kGroups; ++gi) {
      if (gi < ng) group(gi);
    }
  }
  row0 = acc0 + __shfl_xor_sync(0xffffffffu, acc0, 1);
  row1 = acc1 + __shfl_xor_sync(0xffffffffu, acc1, 1);
}

// Work of a block: virtual blocks vb = blockIdx.x, blockIdx.x + gridDim.x, ... < n_vb, each of `units` units
// (a tile of 16 rows of one weight and one vector) of n_slices tasks. Rounds give every warp at most one task:
// with n_slices <= 8, 8 / n_slices units per round, warp w taking slice w % n_slices of unit w / n_slices; with
// more slices, one unit per ceil(n_slices / 8) rounds, warp w taking slices w, w + 8, ... So a warp's slice and
// unit offset are fixed and rounds advance without divisions (these run once per task).
struct Round {
  int vb;
  int u0, sub;  // first unit of the round; round within the unit
  bool last;    // the virtual block's last round
};
struct RoundMap {
  int n_vb, units, n_slices;
  int per_round, sub_rounds, wu, ws, step;  // units per round, rounds per unit; this warp's unit offset, slice
  __device__ __forceinline__ RoundMap(int n_vb_, int units_, int n_slices_, int warp, int n_warps)
      : n_vb(n_vb_), units(units_), n_slices(n_slices_), step(n_warps) {
    const bool few = n_slices <= n_warps;
    per_round = few ? n_warps / n_slices : 1;
    sub_rounds = few ? 1 : (n_slices + n_warps - 1) / n_warps;
    wu = few ? warp / n_slices : 0;
    ws = few ? warp % n_slices : warp;
  }
  __device__ __forceinline__ int n_rounds() const {
    const unsigned bx = blockIdx.x, mine = bx < unsigned(n_vb) ? (unsigned(n_vb) - bx + gridDim.x - 1) / gridDim.x : 0;
    return int(mine) * ((units + per_round - 1) / per_round * sub_rounds);
  }
  __device__ __forceinline__ bool is_last(int u0, int sub) const {
    return sub == sub_rounds - 1 && u0 + per_round >= units;
  }
  __device__ __forceinline__ Round first() const { return {int(blockIdx.x), 0, 0, is_last(0, 0)}; }
  __device__ __forceinline__ Round next(Round c) const {
    if (++c.sub == sub_rounds) {
      c.sub = 0;
      c.u0 += per_round;
      if (c.u0 >= units) {
        c.u0 = 0;
        c.vb += int(gridDim.x);
      }
    }
    c.last = is_last(c.u0, c.sub);
    return c;
  }
  // This warp's task in round c: unit and slice; false when it has none.
  __device__ __forceinline__ bool task(const Round& c, int& unit, int& slice) const {
    unit = c.u0 + wu;
    slice = c.sub * step + ws;
    return wu < per_round && unit < units && slice < n_slices;
  }
};

// Software pipeline over a block's rounds, per warp: each warp streams its tasks' weights through a ring of
// S (default kMmaStages) shared-memory stages with cp.async, S - 1 tasks ahead of the one it computes (with two blocks
// per SM, ~64 KiB of loads in flight per SM: what DRAM bandwidth needs). issue(rd, stage) copies this warp's task of
// round rd into the stage (or nothing); compute(rd, stage) computes it; after(rd) runs when round rd is computed
// (barriers, epilogues). prologue() runs once the first copies are issued (the wait for the previous kernel, staging
// the vector, a barrier). Every thread of the block runs the same rounds.
constexpr int kMmaStages = 3;

template <int S = kMmaStages, class Issue, class Compute, class Prologue, class After>
__device__ __forceinline__ void pipeline(const RoundMap& rm, Issue issue, Compute compute, Prologue prologue,
                                         After after) {
  const int n = rm.n_rounds();
  Round ri = rm.first(), rc = ri;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < n) {
      issue(ri, s);
      ri = rm.next(ri);
    }
    cp_async_commit();  // empty groups keep the wait counts uniform
  }
  prologue();
  int stage = 0;  // i % S
  for (int i = 0; i < n; ++i) {
    cp_async_wait<S - 2>();
    __syncwarp();  // every lane's copies of this stage have landed
    compute(rc, stage);
    __syncwarp();  // every lane is done with the stage before it is refilled
    if (i + S - 1 < n) {
      issue(ri, stage == 0 ? S - 1 : stage - 1);  // the stage computed in the previous iteration
      ri = rm.next(ri);
    }
    cp_async_commit();
    after(rc);
    rc = rm.next(rc);
    stage = stage == S - 1 ? 0 : stage + 1;
  }
  cp_async_wait<0>();
}

// The row's dot product: partial sums part[slice * stride] added in slice order.
__device__ __forceinline__ float fold_slices(const float* part, int n_slices, int stride) {
  float s = part[0];
  for (int i = 1; i < n_slices; ++i) s += part[i * stride];
  return s;
}

// Calls f.template operator()<BITS, GS, ST>() for a weight's bits (4 or 8), group size (32, 64, 128) and scale
// type: the host-side dispatch of the kernels built on these blocks.
template <class F>
void dispatch(const WeightView& w, F&& f) {
  auto by_st = [&]<int BITS, int GS>() {
    switch (w.stype) {
      case FloatType::kF32: f.template operator()<BITS, GS, float>(); break;
      case FloatType::kF16: f.template operator()<BITS, GS, __half>(); break;
      case FloatType::kBF16: f.template operator()<BITS, GS, __nv_bfloat16>(); break;
    }
  };
  auto by_gs = [&]<int BITS>() {
    switch (w.group_size) {
      case 32: by_st.template operator()<BITS, 32>(); break;
      case 64: by_st.template operator()<BITS, 64>(); break;
      default: by_st.template operator()<BITS, 128>(); break;
    }
  };
  if (w.bits == 4) {
    by_gs.template operator()<4>();
  } else {
    by_gs.template operator()<8>();
  }
}

}  // namespace moecel::cuda
