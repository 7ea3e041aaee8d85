// A 16-row tile of 4-/8-bit weights in shared memory (bulk::RowTile, bulk-copied) times a vector staged as the
// B operand in three bf16 planes (gemv_mma.cuh), on tensor cores: the group loops of the fused kernels A and B
// (fused_moe_bulk_mma.cu) and of the streaming lm_head (gemv_stream.cu).
#pragma once
#include <cstdint>

#include "backend/cuda/fused_moe_bulk.cuh"
#include "backend/cuda/gemv_mma.cuh"

namespace moecel::cuda::bulk {

// The MMAs of one group's 32-value blocks given the lane's words of rows gid (w0) and gid + 8 (w1), accumulated in d
// (lane (gid, t): rows gid and gid + 8, columns 2t, 2t + 1). bp: the lane's B-fragment base (planes + plane(gid) +
// t * 16); g: the group's index in the staged vector (kernel B's vector holds k slots' groups one after another).
template <int BITS, int GS, int W>
__device__ __forceinline__ void group_words_mma(const uint32_t (&w0)[W], const uint32_t (&w1)[W],
                                                const unsigned char* bp, int64_t g, int gid, float (&d)[4]) {
  constexpr int kBlocks = GS / 32;
#pragma unroll
  for (int p = 0; p < kBlocks; ++p) {
    uint4 bx = make_uint4(0u, 0u, 0u, 0u);
    if (gid < 3) bx = *reinterpret_cast<const uint4*>(bp + (g * kBlocks + p) * 64);
    uint32_t q[2][4];
    block_frags<BITS>(w0, w1, p, q);
    mma_bf16(d, q[0], bx.x, bx.y);
    mma_bf16(d, q[1], bx.z, bx.w);
  }
}

// One group of a 16-row tile times the staged vector (group_words_mma). row0: the tile's first row in shared memory
// (row stride row_bytes); gl: the group within the rows; g: the same group's index in the staged vector.
template <int BITS, int GS>
__device__ __forceinline__ void tile_group_mma(const unsigned char* row0, int64_t row_bytes, int64_t gl,
                                               const unsigned char* bp, int64_t g, int gid, int t, float (&d)[4]) {
  constexpr int kGroupBytes = GS * BITS / 8, kWords = GS / 32 * BITS / 4;
  uint32_t w[2][kWords];  // rows gid, gid + 8
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    lds_words(row0 + (gid + 8 * h) * row_bytes + gl * kGroupBytes + t * (kGroupBytes / 4), w[h]);
  }
  group_words_mma<BITS, GS>(w[0], w[1], bp, g, gid, d);
}

// Groups per rotation round of tile_groups_mma: the rows of a tile lie row_bytes apart (a multiple of 128 bytes), so
// the 8 rows' loads of one group's columns hit the same kGroupBytes / 4 banks (8-way for 32-byte groups: ncu counted
// 64% of kernel A's shared-memory wavefronts as conflicts); 128 / kGroupBytes consecutive groups would span all banks.
// Two groups at a time halve the conflicts where a lane's words of a group are at most 2 (4-bit g32 / g64, 8-bit
// g32); more groups, or wider ones, cost registers: kernel A (64 per thread, four blocks per SM) spilled, and kernel
// B at 4 groups took 96-118 (or spilled at 80) and made the step slower (docs/benchmarks.md, seventeenth tree).
// 1: no rotation.
template <int BITS, int GS>
constexpr int kRot = (GS * BITS / 8 < 128 && GS / 32 * BITS / 4 <= 2) ? 2 : 1;

// acc += s * sum((q - z) x) + (b + z s) * sum(x) for rows gid (s0, b0) and gid + 8 (s1, b1): lane t == 0 holds columns
// 0, 1 (hi, mid), t == 1 columns 2, 3 (lo, 0); the bias term is added once, by t == 0 (xs is 0 elsewhere).
template <int BITS>
__device__ __forceinline__ void fold_sb(float s0, float b0, float s1, float b1, float xs, const float (&d)[4],
                                        float (&acc)[2]) {
  constexpr float kZero = -kFoldZero<BITS>;
  const float z0 = fmaf(kZero, s0, b0), z1 = fmaf(kZero, s1, b1);
  acc[0] = fmaf(s0, d[0] + d[1], fmaf(z0, xs, acc[0]));
  acc[1] = fmaf(s1, d[2] + d[3], fmaf(z1, xs, acc[1]));
}

// Folds one group's MMA sums into the rows' f32 accumulators (fold_sb with the group's scales and biases).
template <int BITS, typename ST>
__device__ __forceinline__ void fold_group(const RowTile<BITS, ST>& tile, int64_t gl, float xs, int gid,
                                           const float (&d)[4], float (&acc)[2]) {
  fold_sb<BITS>(tile.scale(gid, gl), tile.bias(gid, gl), tile.scale(gid + 8, gl), tile.bias(gid + 8, gl), xs, d, acc);
}

// Words per lane of one row's group: the lane's GS / 4 values (lds_words of kGroupBytes / 4 bytes).
template <int BITS, int GS>
constexpr int kLaneWords = GS / 32 * BITS / 4;

// w[k] <- w[(k - s) % R] for every k (log2(R) rounds of selects): words loaded in rotated order (round i of the
// lanes of row gid read group (i + gid) % R, so the 8 rows spread over R times as many banks) put back in group order.
template <int R, int W>
__device__ __forceinline__ void unrotate_groups(int s, uint32_t (&w)[R][2][W]) {
#pragma unroll
  for (int b = 1; b < R; b <<= 1) {  // w[k] <- w[(k - b) % R] where bit b of s is set
    const bool on = (s & b) != 0;
    uint32_t v[R][2][W];
#pragma unroll
    for (int k = 0; k < R; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int q = 0; q < W; ++q) v[k][h][q] = on ? w[(k - b) & (R - 1)][h][q] : w[k][h][q];
      }
    }
#pragma unroll
    for (int k = 0; k < R; ++k) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int q = 0; q < W; ++q) w[k][h][q] = v[k][h][q];
      }
    }
  }
}

// The lane's words of groups gl0 .. gl0 + R - 1 of rows gid and gid + 8 of a tile, w[i] holding group gl0 + i, loaded
// in rotated order (unrotate_groups).
template <int BITS, int GS, typename ST, int R>
__device__ __forceinline__ void load_groups_rotated(const RowTile<BITS, ST>& tile, int gl0, int gid, int t,
                                                    uint32_t (&w)[R][2][kLaneWords<BITS, GS>]) {
  constexpr int kGroupBytes = GS * BITS / 8;
  static_assert((R & (R - 1)) == 0 && R <= 8, "R: a power of two up to 8");
  const int s = gid & (R - 1), row_bytes = int(tile.row_bytes);  // 32-bit offsets: kernel A has 64 registers
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int gl = gl0 + ((i + s) & (R - 1));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      lds_words(tile.base + (gid + 8 * h) * row_bytes + gl * kGroupBytes + t * (kGroupBytes / 4), w[i][h]);
    }
  }
  unrotate_groups<R>(s, w);
}

// The scales and biases of groups gl0 .. gl0 + R - 1 of rows gid (h = 0) and gid + 8 (h = 1): a row's R values are
// consecutive, loaded at once where they fill whole words (aligned: the callers' rows hold a multiple of R groups).
template <int BITS, typename ST, int R>
struct GroupScales {
  static constexpr bool kVec = R * int(sizeof(ST)) % 4 == 0;
  static constexpr int kN = kVec ? R * int(sizeof(ST)) / 4 : 1;
  const RowTile<BITS, ST>& tile;
  int gl0, gid;
  uint32_t sc[2][kN], bi[2][kN];
  __device__ __forceinline__ GroupScales(const RowTile<BITS, ST>& tl, int gl0_, int gid_)
      : tile(tl), gl0(gl0_), gid(gid_) {
    if constexpr (kVec) {
      const int srow = int(tile.srow_bytes), n_rows = tile.n_rows;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned char* p =
            tile.base + n_rows * int(tile.row_bytes) + (gid + 8 * h) * srow + gl0 * int(sizeof(ST));
        lds_words(p, sc[h]);
        lds_words(p + n_rows * srow, bi[h]);
      }
    }
  }
  // sc0 / bi0: the scale and bias words of rows gid (h = 0) and gid + 8 at group 0 (only read where kVec).
  __device__ __forceinline__ GroupScales(const RowTile<BITS, ST>& tl, const unsigned char* const (&sc0)[2],
                                         const unsigned char* const (&bi0)[2], int gl0_, int gid_)
      : tile(tl), gl0(gl0_), gid(gid_) {
    if constexpr (kVec) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        lds_words(sc0[h] + gl0 * int(sizeof(ST)), sc[h]);
        lds_words(bi0[h] + gl0 * int(sizeof(ST)), bi[h]);
      }
    }
  }
  __device__ __forceinline__ float scale(int h, int i) const {
    if constexpr (kVec) return packed_at<ST>(sc[h], i);
    return tile.scale(gid + 8 * h, gl0 + i);
  }
  __device__ __forceinline__ float bias(int h, int i) const {
    if constexpr (kVec) return packed_at<ST>(bi[h], i);
    return tile.bias(gid + 8 * h, gl0 + i);
  }
};

// Groups gl0 .. gl0 + R - 1 of a 16-row tile, each exactly as tile_group_mma computes it and folded in order into acc
// (fold_sb; xsum: the staged vector's group sums from group g0, bp as in tile_group_mma), the words loaded without
// bank conflicts (load_groups_rotated).
template <int BITS, int GS, typename ST, int R>
__device__ __forceinline__ void tile_groups_mma(const RowTile<BITS, ST>& tile, int gl0, const unsigned char* bp, int g0,
                                                const float* xsum, int gid, int t, float (&acc)[2]) {
  uint32_t w[R][2][kLaneWords<BITS, GS>];  // [group][row gid, gid + 8]
  load_groups_rotated<BITS, GS, ST, R>(tile, gl0, gid, t, w);
  const GroupScales<BITS, ST, R> sb(tile, gl0, gid);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    group_words_mma<BITS, GS>(w[i][0], w[i][1], bp, g0 + i, gid, d);
    const float xs = t == 0 ? xsum[g0 + i] : 0.0f;
    fold_sb<BITS>(sb.scale(0, i), sb.bias(0, i), sb.scale(1, i), sb.bias(1, i), xs, d, acc);
  }
}

}  // namespace moecel::cuda::bulk
