// The fused kernels A and B on int8 tensor cores (FusedMoeArgs::imma): the vector as fixed point and the weights' raw
// codes, multiplied exactly by mma.sync m16n8k32 (u8 codes, s8 digits, s32 sums).
//
// Why: with bf16 operands (bulk_mma.cuh) a 4-bit code costs ~7 instructions per 8 codes to unpack and each 32 values
// of a row take two m16n8k16 MMAs; after their rows land, kernels A and B are issue-bound (docs/benchmarks.md,
// twenty-ninth tree). As u8, 8 codes of a packed word are two bytes-of-nibbles (w & 0x0f0f0f0f and w >> 4 &
// 0x0f0f0f0f: 3 instructions), 8-bit codes need none, and one MMA takes 32 values.
//
// The vector, per group g: q = rint(x 2^S_g), |q| <= 2^22, S_g from the group's largest |x| (so no value waits for
// the whole vector's), as three signed base-256 digits (B columns 0-2, most significant first; 3-7 zero): q = 2^16 D0
// + 2^8 D1 + D2 exactly. A value's error is at most 2^-22 of its group's largest (f32's: 2^-24 of itself). Staging
// costs one fma and one add per value (the rounding by the magic 1.5 * 2^23; F2I would use the 16-per-clock
// conversion unit, and a max over the whole vector a block barrier: both measured slower). A group's s32 sums are
// exact; lane t == 0 holds columns 0, 1 and t == 1 column 2, each folded as acc += s 2^(+-8 - S_g) f32(256 Dlo + Dhi)
// (+ b sum(x) on t == 0).
#pragma once
#include <cstdint>

#include "backend/cuda/bulk_mma.cuh"

namespace moecel::cuda::bulk {

// Bytes of one digit plane of an n-value vector: a lane (gid, t) reads GS / 4 bytes of plane gid at t * GS / 4, so the
// plane stride mod 128 keeps the three planes' reads of one phase in distinct banks.
template <int GS>
__host__ __device__ constexpr int64_t imma_plane_bytes(int64_t n) {
  return (n + 127) / 128 * 128 + (GS == 32 ? 32 : GS == 64 ? 64 : 16);
}

// Bytes of an n-value vector's whole operand: its three digit planes, then per group (sum, 2^-S) as a float2 (xe).
template <int GS>
__host__ __device__ constexpr int64_t imma_operand_bytes(int64_t n) {
  return 3 * imma_plane_bytes<GS>(n) + (n / GS) * 8;
}

// 2^e as an f32, -126 <= e <= 127.
__device__ __forceinline__ float exp2i(int e) {
  return __int_as_float((e + 127) << 23);
}

// S with m 2^S < 2^22 for m > 0 (0 for 0, inf or NaN; clamped so that 2^S and 2^(-8 - S) stay normal).
__device__ __forceinline__ int imma_shift(float m) {
  const int e = (__float_as_int(m) >> 23) & 0xff;  // m < 2^(e - 126)
  if (!(m > 0.0f) || e == 255) return 0;
  return min(max(148 - e, -110), 110);
}

// The digits of q = rint(v[i] mul) (|q| <= 2^22) for an octet, planes 0-2 (most significant first), in the B fragments'
// order for the codes of a packed word: BITS 4: b0 = values 0, 2, 4, 6 (w & 0x0f0f0f0f), b1 = 1, 3, 5, 7 (w >> 4 &
// ...); BITS 8: values 0-3 and 4-7. fma(v, mul, 1.5 * 2^23) rounds v mul to an integer in its low bits; with 0x8080
// added, bytes 1, 0 are digits + 128 (balanced digits) and byte 2 the signed top digit.
template <int BITS>
__device__ __forceinline__ void imma_digits(const float (&v)[8], float mul, uint32_t (&dig)[3][2]) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  uint32_t y[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) y[i] = __float_as_uint(fmaf(v[i], mul, kMagic)) + (0x8080u - 0x4B400000u);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t a = BITS == 4 ? y[r] : y[4 * r], b = BITS == 4 ? y[r + 2] : y[4 * r + 1];
    const uint32_t c = BITS == 4 ? y[r + 4] : y[4 * r + 2], d = BITS == 4 ? y[r + 6] : y[4 * r + 3];
    const uint32_t hab = __byte_perm(a, b, 0x5162), lab = __byte_perm(a, b, 0x4040);  // a2 b2 a1 b1, a0 b0 . .
    const uint32_t hcd = __byte_perm(c, d, 0x5162), lcd = __byte_perm(c, d, 0x4040);
    dig[0][r] = __byte_perm(hab, hcd, 0x5410);
    dig[1][r] = __byte_perm(hab, hcd, 0x7632) ^ 0x80808080u;
    dig[2][r] = __byte_perm(lab, lcd, 0x5410) ^ 0x80808080u;
  }
}

// Stages n values (n % GS == 0) as the int8 B operand: three digit planes imma_plane_bytes(n) apart (octet o at bytes
// [8 o, 8 o + 8) of each, imma_digits' order) and per group g, xe[g] = (its sum in mma_stage's order, 2^-S_g).
// load8(i, v) reads values i .. i + 7; kOct octets per thread are loaded before any is converted (a loop of
// load-then-store steps is a chain of L2 round trips). Every thread of the block calls it (kThreads of them); the
// caller synchronizes before the planes are read.
template <int BITS, int GS, int kOct, class Load8>
__device__ __forceinline__ void imma_stage(int64_t n, Load8 load8, unsigned char* planes, float2* xe) {
  constexpr int kOctPerGroup = GS / 8;
  const int64_t n_oct = n / 8, plane = imma_plane_bytes<GS>(n);
  for (int64_t o0 = 0; o0 < n_oct; o0 += int64_t(kThreads) * kOct) {  // uniform trip count: shuffles need every lane
    float v[kOct][8];
    load_octets<kOct>(o0, n_oct, load8, v);
#pragma unroll
    for (int u = 0; u < kOct; ++u) {
      const int64_t o = o0 + u * kThreads + threadIdx.x;
      // A group's octets are kOctPerGroup consecutive lanes of one warp (o0 + u * kThreads is a multiple of 32).
      float m = fabsf(v[u][0]);
#pragma unroll
      for (int i = 1; i < 8; ++i) m = fmaxf(m, fabsf(v[u][i]));
      float sum = octet_sum(v[u]);
#pragma unroll
      for (int off = 1; off < kOctPerGroup; off <<= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
        sum += __shfl_xor_sync(0xffffffffu, sum, off);
      }
      const int s = imma_shift(m);
      if (o < n_oct) {
        uint32_t dig[3][2];
        imma_digits<BITS>(v[u], exp2i(s), dig);
#pragma unroll
        for (int p = 0; p < 3; ++p) {
          *reinterpret_cast<uint2*>(planes + p * plane + o * 8) = make_uint2(dig[p][0], dig[p][1]);
        }
        if (o % kOctPerGroup == 0) xe[o / kOctPerGroup] = make_float2(sum, exp2i(-s));
      }
    }
  }
}

// What lane t multiplies a group's 2^-S_g by: its columns' sum 256 D + D' weighs 2^8 (t == 0: digits 0, 1) or 2^-8
// (t == 1: digit 2 and a zero column); other lanes' sums are 0.
__device__ __forceinline__ float imma_lane_mul(int t) {
  return t == 0 ? 256.0f : 1.0f / 256.0f;
}

// A round's R groups given the lane's words w (in group order) and the groups' scales and biases: each group's MMAs
// (4-bit codes as u8, the even and odd nibbles in imma_digits' order; 8-bit words as they are) and its fold into acc
// as the file comment says.
template <int BITS, int GS, typename ST, int R>
__device__ __forceinline__ void imma_round(const uint32_t (&w)[R][2][kLaneWords<BITS, GS>],
                                           const GroupScales<BITS, ST, R>& sb, const unsigned char* bp, int g0,
                                           const float2* xe, int gid, int t, float lane_mul, float (&acc)[2]) {
  constexpr int kBlocks = GS / 32;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    uint32_t bx[2 * kBlocks];
#pragma unroll
    for (int q = 0; q < 2 * kBlocks; ++q) bx[q] = 0u;
    if (gid < 3) lds_words(bp + (g0 + i) * GS, bx);
    int d[4] = {0, 0, 0, 0};
#pragma unroll
    for (int p = 0; p < kBlocks; ++p) {
      uint32_t a[4];
      if constexpr (BITS == 4) {
        a[0] = w[i][0][p] & 0x0f0f0f0fu;
        a[1] = w[i][1][p] & 0x0f0f0f0fu;
        a[2] = (w[i][0][p] >> 4) & 0x0f0f0f0fu;
        a[3] = (w[i][1][p] >> 4) & 0x0f0f0f0fu;
      } else {
        a[0] = w[i][0][2 * p];
        a[1] = w[i][1][2 * p];
        a[2] = w[i][0][2 * p + 1];
        a[3] = w[i][1][2 * p + 1];
      }
      mma_u8s8(d, a, bx[2 * p], bx[2 * p + 1]);
    }
    const float2 g = xe[g0 + i];
    const float xs = t == 0 ? g.x : 0.0f, f = g.y * lane_mul;
    acc[0] = fmaf(sb.scale(0, i) * f, __int2float_rn(d[0] * 256 + d[1]), fmaf(sb.bias(0, i), xs, acc[0]));
    acc[1] = fmaf(sb.scale(1, i) * f, __int2float_rn(d[2] * 256 + d[3]), fmaf(sb.bias(1, i), xs, acc[1]));
  }
}

// A lane's addresses in a 16-row tile for tile_groups_imma, computed once per tile: the words of rotated group slot i
// (load_groups_rotated) of rows gid and gid + 8 at group 0, and those rows' scale and bias words at group 0. Rebuilt
// from the tile for every round of groups they had cost ~35 of kernel B's 119 instructions per round.
template <int BITS, int GS, typename ST, int R>
struct ImmaLane {
  static constexpr int kGroupBytes = GS * BITS / 8;
  const unsigned char* w[R][2];
  const unsigned char* sc[2];
  const unsigned char* bi[2];
  int s;  // the lane's rotation
  __device__ __forceinline__ ImmaLane(const RowTile<BITS, ST>& tile, int gid, int t) : s(gid & (R - 1)) {
    const int row_bytes = int(tile.row_bytes), srow = int(tile.srow_bytes), n = tile.n_rows;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const unsigned char* row = tile.base + (gid + 8 * h) * row_bytes + t * (kGroupBytes / 4);
#pragma unroll
      for (int i = 0; i < R; ++i) w[i][h] = row + ((i + s) & (R - 1)) * kGroupBytes;
      sc[h] = tile.base + n * row_bytes + (gid + 8 * h) * srow;
      bi[h] = sc[h] + n * srow;
    }
  }
};

// Groups gl0 .. gl0 + R - 1 of a 16-row tile times the int8 operand (imma_stage; lane: ImmaLane of the tile; bp: planes
// + plane(gid) + t * GS / 4; g0: the first group's index in the staged vector; lane_mul: imma_lane_mul(t)), folded in
// order into acc as the file comment says.
template <int BITS, int GS, typename ST, int R>
__device__ __forceinline__ void tile_groups_imma(const RowTile<BITS, ST>& tile, const ImmaLane<BITS, GS, ST, R>& lane,
                                                 int gl0, const unsigned char* bp, int g0, const float2* xe, int gid,
                                                 int t, float lane_mul, float (&acc)[2]) {
  constexpr int kGroupBytes = GS * BITS / 8;
  uint32_t w[R][2][kLaneWords<BITS, GS>];  // [group][row gid, gid + 8]
#pragma unroll
  for (int i = 0; i < R; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) lds_words(lane.w[i][h] + gl0 * kGroupBytes, w[i][h]);
  }
  unrotate_groups<R>(lane.s, w);
  const GroupScales<BITS, ST, R> sb(tile, lane.sc, lane.bi, gl0, gid);
  imma_round<BITS, GS, ST, R>(w, sb, bp, g0, xe, gid, t, lane_mul, acc);
}

// The same with every address built from the tile for this round (kernel A and the int8 matrix-vector kernels, at
// their 64-register bound: kept across rounds, the lane's addresses made some of their 8-bit variants spill).
template <int BITS, int GS, typename ST, int R>
__device__ __forceinline__ void tile_groups_imma(const RowTile<BITS, ST>& tile, int gl0, const unsigned char* bp,
                                                 int g0, const float2* xe, int gid, int t, float lane_mul,
                                                 float (&acc)[2]) {
  uint32_t w[R][2][kLaneWords<BITS, GS>];  // [group][row gid, gid + 8]
  load_groups_rotated<BITS, GS, ST, R>(tile, gl0, gid, t, w);
  const GroupScales<BITS, ST, R> sb(tile, gl0, gid);
  imma_round<BITS, GS, ST, R>(w, sb, bp, g0, xe, gid, t, lane_mul, acc);
}

}  // namespace moecel::cuda::bulk
