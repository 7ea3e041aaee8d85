// Tensor-core tiled matrix product (prefill) for 4- and 8-bit MLX affine weights and dense BF16 weights:
// mma.sync m16n8k16 (bf16 in, f32 accumulate) on 128 output rows x 64 (token, slot) pairs per block, with a
// 4-stage cp.async pipeline of 32-wide slices of `in` (packed weight words and f32 x rows).
// Used by: launch_gemm (qgemm.cu), which falls back to the CUDA-core kernel when launch_gemm_mma declines.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>

#include "backend/cuda/mma_frag.cuh"
#include "backend/cuda/moe.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {
namespace {

// Precision. The weight operand is the centered integer code c = q - z, z = 2^(bits-1) (c in [-8, 7] or
// [-128, 127], exact in bf16); scale and bias are applied in f32 per group:
//   y = sum_g s_g * (sum_{k in g} c_k x_k) + (b_g + z s_g) * (sum_{k in g} x_k),
// the bias term from the f32 x. Centering matters: with the raw code q in [0, 2^bits) the error of x's
// representation enters as s * sum(q dx) while y ~ s * sum((q - z) x), so it was amplified 3-10x on real
// checkpoints (whose codes cluster around z); tiny models amplify a matmul's error another ~30x into the logits.
// x (f32, any magnitude) becomes 16-bit MMA operands:
//  - kSplitX (default), quantized weights: each x row is first scaled by a power of two 2^e that puts its largest
//    magnitude in [2^14, 2^15) (split_x.cu, once per row of x; exact), then split into two f16 terms hi + lo, each the
//    f16 rounding of what is left; two MMAs per fragment, and y is scaled back by 2^-e (exact). The codes are exact in
//    f16, hi + lo keeps 22 of x's 24 significant bits (|x - hi - lo| <= 2^-23 |x| + 2^-25 max|x|), and the
//    products are exact, so the error is that of the f32 accumulation plus about one f32 rounding of x
//    (~1e-14 normalized MSE on small rows). f16 without the row scale would overflow past 65504 and lose small
//    values to subnormals; two bf16 terms (16-17 bits) gave ~1e-10 per matmul, which the golden checkpoints'
//    logits amplified past 1e-4 relative L2.
//  - kSplitX, dense BF16 weights (the B operand's type must match them): x = hi + mid + lo, each the bf16 rounding
//    of what is left; three MMAs per fragment. x - hi has at most 16 significant bits and x - hi - mid at most 8,
//    so the sum is exact (down to |x| ~ 1e-33, where lo would be a bf16 subnormal).
//  - kBf16X (MOECEL_CUDA_MMA=fast): x = bf16(x) only; relative rounding error <= 2^-8 per element, which gives a
//    normalized MSE of ~3e-6 against f32 (like running the activations in bf16), at a third of the MMA work.
// Tensor cores truncate each MMA's f32 sum toward zero, a bias that grows with the length of a chain of MMAs on
// one accumulator; so the MMAs accumulate into `part` for one group (quantized) or one 32-slice (dense) only, and
// `part` is folded into `acc` with round-to-nearest f32 arithmetic.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"; groupID = lane / 4,
// tig = lane % 4; two bf16 per .b32 register, the lower-indexed element in the lower 16 bits):
//   A (16 x 16, row-major): a0,a1: (row groupID, col 2*tig + {0,1}); a2,a3: (row groupID + 8, same cols);
//                           a4,a5: (row groupID, col 2*tig + 8 + {0,1}); a6,a7: (row groupID + 8, same cols).
//   B (16 x 8, "col"):      b0,b1: (row 2*tig + {0,1}, col groupID); b2,b3: (row 2*tig + 8 + {0,1}, col groupID).
//   C/D (16 x 8, f32):      c0,c1: (row groupID, col 2*tig + {0,1}); c2,c3: (row groupID + 8, same cols).
// Rows of A are output rows, columns of B are pairs, and the MMA's k index is free to be any permutation of the
// slice as long as A and B agree. k slots 2*tig + {0,1}, 2*tig + 8 + {0,1} of both k16 steps of a 32-slice
// are held only by lanes with the same tig, so each tig takes the 8 consecutive values [8*tig, 8*tig + 8) of the
// slice, in the order (k0, k4), (k1, k5) for step 0 and (k2, k6), (k3, k7) for step 1. For 4-bit weights these
// 8 values are exactly packed word tig of the row's slice and (k_j, k_j+4) are nibbles j and j + 4, i.e. bits
// [4j, 4j + 4) and [4j + 16, 4j + 20): one mask-or puts them into a bf16x2 as 128 + q, one bf16x2 fma centers
// them. For 8-bit weights they are bytes j of words 2*tig and 2*tig + 1. x is stored in shared memory already in that
// order, so every fragment is one 32-bit (4-bit weights), 64-bit (8-bit) or 128-bit (bf16 weights, x) shared load per
// lane: no ldmatrix is needed, and each fragment load is conflict-free (see the layout notes below).

constexpr int kWarpsM = 4, kWarpsN = 2;  // warp tile 32 rows x 32 pairs: 2 x 4 m16n8 fragments
constexpr int kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kBM = 32 * kWarpsM;  // output rows per block
constexpr int kBN = 32 * kWarpsN;  // pairs per block
constexpr int kBK = 32;            // slice of `in` per stage (one quantized chunk: never straddles a group)
constexpr int kStages = 4;         // cp.async pipeline depth (slices in flight)
constexpr int kXrLd = kBK + 4;     // raw x row: 144 bytes, so 8 lanes' 16-byte reads hit 8 distinct bank quads
static_assert(kBN == kGemmTileTokens, "the routing kernel cuts tiles of kGemmTileTokens pairs");
static_assert(kThreads == kBN * 4, "the x conversion gives each thread one 8-value chunk of one pair");

enum class Fmt { kQ4, kQ8, kBF16 };

// Bytes of one weight row per stage: 4 words (4-bit), 8 words (8-bit), 32 bf16.
template <Fmt F>
constexpr int kRowBytes = F == Fmt::kQ4   ? 16
                          : F == Fmt::kQ8 ? 32
                                          : 64;

// Dynamic shared memory (byte offsets, all multiples of 16):
//   xr   [kStages][kBN][kXrLd] f32     raw x slices as cp.async writes them (not with the f16 split)
//   wq   [kStages][kBM][row bytes]     weight slices (packed words or bf16), rows of 16 / 32 / 64 bytes
//   xb   [bufs][kXTerms][kBN][kBK]     16-bit x terms (hi, lo or hi, mid, lo), 64-byte rows, each 8-chunk in
//                                      (k0,k4,k1,k5,k2,k6,k3,k7) order: converted here into 2 buffers, or (f16 split)
//                                      copied by cp.async from split_x.cu's planes into kStages buffers
//   xsum [2 or kStages][kBN] f32       sum of x over the current group, per pair (affine bias term): from the
//                                      conversion, or (f16 split) copied from split_x.cu's sums with the group's
//                                      last slice into that slice's slot
//   xoff [kBN] int64, pair [kBN] int   x row offset and pair id of each column (-1: no pair)
//   xrow [kBN] int, xsc [kBN] float2   x row and its (2^e, 2^-e) of each column (f16 split only)
template <Fmt F, bool SPLIT>
struct Layout {
  static constexpr bool kF16 = SPLIT && F != Fmt::kBF16;  // x as two f16 terms of the row-scaled x
  static constexpr int kXTerms = !SPLIT ? 1 : kF16 ? 2 : 3;
  static constexpr size_t kXbPlane = size_t(kBN) * kBK * 2;
  static constexpr size_t kXbBuf = kXTerms * kXbPlane;
  static constexpr int kXbBufs = kF16 ? kStages : 2;
  static constexpr size_t kXr = 0;
  static constexpr size_t kWq = kXr + (kF16 ? 0 : size_t(kStages) * kBN * kXrLd * 4);
  static constexpr size_t kXb = kWq + size_t(kStages) * kBM * kRowBytes<F>;
  static constexpr size_t kXsum = kXb + kXbBufs * kXbBuf;
  static constexpr size_t kXoff = kXsum + kXbBufs * kBN * 4;
  static constexpr size_t kPair = kXoff + kBN * 8;
  static constexpr size_t kXrow = kPair + kBN * 4;
  static constexpr size_t kXsc = kXrow + (kF16 ? kBN * 4 : 0);
  static constexpr size_t kBytes = kXsc + (kF16 ? kBN * 8 : 0);
};

struct MmaArgs {
  WeightView w;
  const float* x;
  float* y;
  PairMap map;
  int64_t n_pairs;
  TileList tiles;  // tiles.order == nullptr: plain linear
  int64_t max_tiles;
  SplitX sx;  // x already split (quantized weights at MmaPrecision::kSplitX)
  // Up to three weights of one input in one launch (q, k and v): part i takes the row blocks [part_end[i - 1],
  // part_end[i]) of grid.x and writes its own y; w and y above are part 0's.
  int n_parts = 1;
  unsigned part_end[2] = {0, 0};
  WeightView w1, w2;
  float* y1 = nullptr;
  float* y2 = nullptr;
  // >= 0 (a GluAct; f16 split only): w is gate and w1 is up; each block takes kBM / 2 rows of both and writes
  // y = act(gate x) * (up x) from its epilogue.
  int glu = -1;
  // > 0 (f16 split only): each tile's scale and bias rows are copied into shared memory after the layout, rows of
  // this many bytes (groups * sizeof(scale) + 16 of padding that spreads the banks); 0: read from global memory at
  // each group's end (staged_scale_row decides).
  int scale_row_bytes = 0;
};

// Largest scale row staged in shared memory: with 128 rows of scales and of biases, 2 x 128 x 272 bytes.
constexpr int kMaxStagedScaleRow = 256;
constexpr size_t kMaxStagedScaleBytes = size_t(2) * kBM * (kMaxStagedScaleRow + 16);

constexpr int kGluLd = kBM / 2 + 4;  // floats per row of the up half staged for the GLU epilogue (spreads banks)

__device__ __forceinline__ float glu_of(int act, float g, float u) {
  switch (act) {
    case int(GluAct::kGeLU): return glu_value<GluAct::kGeLU>(g, u);
    case int(GluAct::kReLU2): return glu_value<GluAct::kReLU2>(g, u);
    default: return glu_value<GluAct::kSiLU>(g, u);
  }
}

// Values j and j + 4 of 8 consecutive bf16 (u.x = (v0, v1), ..., u.w = (v6, v7)) as bf16x2.
__device__ __forceinline__ uint32_t bf16_pair(const uint4& u, int j) {
  const uint32_t p = j < 2 ? u.x : u.y, q = j < 2 ? u.z : u.w;
  return __byte_perm(p, q, (j & 1) ? 0x7632u : 0x5410u);
}

// Preconditions (checked by launch_gemm_mma): blockDim.x == kThreads; dynamic shared memory Layout::kBytes;
// w.w and x 16-byte aligned; quantized: in % 32 == 0, group_size % 32 == 0; dense: in % 8 == 0; every pair id in
// the tile list is < n_pairs.
template <Fmt F, typename ST, bool SPLIT>
__global__ void __launch_bounds__(kThreads, 2) mma_gemm_kernel(MmaArgs a) {
  using L = Layout<F, SPLIT>;
  constexpr bool kQuant = F != Fmt::kBF16;
  constexpr int kBits = F == Fmt::kQ4 ? 4 : 8;
  constexpr float kCodeZero = float(1 << (kBits - 1));  // subtracted from every code by q4_pair / q8_pair
  constexpr int kChunksPerRow = kRowBytes<F> / 16;
  extern __shared__ __align__(16) unsigned char smem[];
  float* xr = reinterpret_cast<float*>(smem + L::kXr);
  unsigned char* wq = smem + L::kWq;
  unsigned char* xb = smem + L::kXb;
  float* xsum = reinterpret_cast<float*>(smem + L::kXsum);
  int64_t* xoff = reinterpret_cast<int64_t*>(smem + L::kXoff);
  int* pair_of = reinterpret_cast<int*>(smem + L::kPair);
  int* xrow_of = reinterpret_cast<int*>(smem + L::kXrow);
  float2* xsc = reinterpret_cast<float2*>(smem + L::kXsc);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp % kWarpsM, wn = warp / kWarpsM;  // this warp: rows 32 wm .., pairs 32 wn ..
  const int grp_id = lane >> 2, tig = lane & 3;
  const int cp = tid >> 2, cc = tid & 3;  // conversion: pair cp, values [8 cc, 8 cc + 8) of each slice
  // This block's part (branches, not an indexed parameter array, which would go through local memory).
  WeightView w = a.w;
  float* y = a.y;
  unsigned first_block = 0;
  if (a.n_parts > 1 && blockIdx.x >= a.part_end[0]) {
    const bool third = a.n_parts > 2 && blockIdx.x >= a.part_end[1];
    w = third ? a.w2 : a.w1;
    y = third ? a.y2 : a.y1;
    first_block = third ? a.part_end[1] : a.part_end[0];
  }
  // GLU: warps wm 0, 1 take gate rows row0 + [0, 64), warps 2, 3 the same rows of up; weight rows likewise.
  const bool glu = L::kF16 && a.glu >= 0;
  const int64_t in = w.in, out = w.out;
  const int64_t row0 = int64_t(blockIdx.x - first_block) * (glu ? kBM / 2 : kBM);
  const int64_t wrow0 = row0 + 32 * (glu ? (wm & 1) : wm);  // this warp's first output row
  const bool up_warp = glu && wm >= 2;
  const int n_steps = int((in + kBK - 1) / kBK);
  const int spg = kQuant ? w.group_size / kBK : 1;  // slices per quantization group
  const int64_t groups = kQuant ? in / w.group_size : 0;
  const int64_t w_row_bytes = kQuant ? in * kBits / 8 : in * 2;
  const bool routed = a.tiles.order != nullptr;
  const int64_t n_tiles = routed ? min(int64_t(*a.tiles.n_tiles), a.max_tiles) : (a.n_pairs + kBN - 1) / kBN;
  const int srb = L::kF16 ? a.scale_row_bytes : 0;  // staged scale row stride, 0: not staged
  unsigned char* ssm = smem + L::kBytes;            // [2][kBM][srb]: scales, then biases (zeros without biases)

  for (int64_t tile = blockIdx.y; tile < n_tiles; tile += gridDim.y) {
    int64_t expert = 0, start = tile * kBN;
    int count = int(min(int64_t(kBN), a.n_pairs - start));
    if (routed) {
      expert = a.tiles.expert[tile];
      start = a.tiles.start[tile];
      count = a.tiles.count[tile];
    }
    __syncthreads();  // the previous tile is done with every shared buffer
    if (tid < kBN) {
      const int p = tid < count ? (routed ? a.tiles.order[start + tid] : int(start + tid)) : -1;
      pair_of[tid] = p;
      const int64_t xrow = p < 0 ? 0 : (a.map.x_per_slot ? int64_t(p) : p / a.map.k);
      xoff[tid] = xrow * in;
      if constexpr (L::kF16) {
        xrow_of[tid] = int(xrow);
        xsc[tid] = p < 0 ? make_float2(1.0f, 1.0f) : a.sx.scale[xrow];
      }
    }
    __syncthreads();

    const unsigned char* wbase = static_cast<const unsigned char*>(w.w) + expert * out * w_row_bytes;
    const unsigned char* wbase_up =
        glu ? static_cast<const unsigned char*>(a.w1.w) + expert * out * w_row_bytes : wbase;
    // This warp's scales and biases (up's for the GLU's up warps).
    const WeightView& ww = up_warp ? a.w1 : w;
    const ST* sbase = kQuant ? static_cast<const ST*>(ww.scales) + expert * out * groups : nullptr;
    const ST* bbase = kQuant && ww.biases ? static_cast<const ST*>(ww.biases) + expert * out * groups : nullptr;
    // Position in the quantization group, by counters (each lambda below runs on consecutive slices): divisions by
    // the group size cost more than the rest of a slice's bookkeeping.
    int iss_pos = 0, iss_grp = 0, cvt_pos = 0, cmp_pos = 0, cmp_grp = 0;

    // Slice st of x and of the weight rows into pipeline slot st % kStages. Rows past `out` and values past `in`
    // are zero-filled; columns without a pair are skipped (their outputs are never stored, and an MMA column
    // depends only on its own B column).
    // The 16-byte chunks a thread copies are the same in every slice: their sources are set once per tile and
    // advance by one slice per issue. Weight chunk i = tid + j * kThreads: row r = i / kChunksPerRow (of up past
    // kBM / 2 rows with the GLU), chunk c = i % kChunksPerRow; f16-split x chunk i: pair i / 8, chunk i % 8.
    constexpr int kXChunks = kBN * (kBK / 4), kWChunks = kBM * kChunksPerRow;  // 16-byte chunks per slice
    constexpr int kWj = (kWChunks + kThreads - 1) / kThreads, kXj = kXChunks / kThreads;
    static_assert(kXChunks % kThreads == 0, "x chunks split evenly over the threads");
    const unsigned char* wsrc[kWj];
    bool wrow_ok[kWj];
#pragma unroll
    for (int j = 0; j < kWj; ++j) {
      const int i = tid + j * kThreads, r = i / kChunksPerRow, c = i % kChunksPerRow;
      const int64_t row = row0 + (glu ? r % (kBM / 2) : r);
      const unsigned char* base = glu && r >= kBM / 2 ? wbase_up : wbase;
      wrow_ok[j] = (kWChunks % kThreads == 0 || i < kWChunks) && row < out;
      wsrc[j] = wrow_ok[j] ? base + row * w_row_bytes + 16 * c : base;
    }
    const unsigned char* xsrc[L::kF16 ? kXj : 1];
    if constexpr (L::kF16) {
#pragma unroll
      for (int j = 0; j < kXj; ++j) {
        const int p = (tid + j * kThreads) / 8, c = (tid + j * kThreads) % 8;
        xsrc[j] = a.sx.planes + (p < count ? xoff[p] * 4 : 0) + c * 16;
      }
    }
    auto issue = [&](int st) {
      const int slot = st % kStages;
      const bool grp_last = kQuant && ++iss_pos == spg;  // this slice ends a group
      if (grp_last) iss_pos = 0;
      const int64_t k0 = int64_t(st) * kBK;
      if constexpr (L::kF16) {  // 128 bytes per pair: the slice's hi then lo term (in % 32 == 0: always valid)
        unsigned char* xdst = xb + slot * L::kXbBuf;
#pragma unroll
        for (int j = 0; j < kXj; ++j) {
          const int i = tid + j * kThreads, p = i / 8, c = i % 8;
          if (p < count) {
            cp_async16(smem_addr(xdst + (c >> 2) * L::kXbPlane + p * (kBK * 2) + (c & 3) * 16), xsrc[j] + k0 * 4, true);
          }
        }
        if (tid < count && grp_last) {  // the group's x sums ride with its last slice
          cp_async4(smem_addr(xsum + slot * kBN + tid), a.sx.gsum + int64_t(xrow_of[tid]) * groups + iss_grp, true);
        }
      } else {
        float* xdst = xr + slot * (kBN * kXrLd);
#pragma unroll
        for (int j = 0; j < kXChunks / kThreads; ++j) {
          const int i = tid + j * kThreads, p = i / (kBK / 4), c = i % (kBK / 4);
          const int64_t k = k0 + 4 * c;
          const bool valid = k < in;
          if (p < count) cp_async16(smem_addr(xdst + p * kXrLd + 4 * c), valid ? a.x + xoff[p] + k : a.x, valid);
        }
      }
      unsigned char* wdst = wq + slot * (kBM * kRowBytes<F>);
#pragma unroll
      for (int j = 0; j < kWj; ++j) {
        const int i = tid + j * kThreads, r = i / kChunksPerRow, c = i % kChunksPerRow;
        const bool valid = wrow_ok[j] && (kQuant || k0 + 8 * c < in);
        const int64_t byte = kQuant ? k0 * kBits / 8 : k0 * 2;  // this slice's offset into the row
        if (kWChunks % kThreads == 0 || i < kWChunks) {
          cp_async16(smem_addr(wdst + r * kRowBytes<F> + 16 * c), valid ? wsrc[j] + byte : wsrc[j], valid);
        }
      }
      if (grp_last) ++iss_grp;
    };

    // Slice st of x (not with the f16 split): f32 -> bf16 terms in fragment order into xb[st & 1]; the group sums
    // of x go to xsum[st & 1] at the group's last slice.
    float run = 0.0f;  // this thread's part of the current group's sum of x (pair cp)
    auto convert = [&](int st) {
      const float* src = xr + (st % kStages) * (kBN * kXrLd) + cp * kXrLd + 8 * cc;
      float v[8] = {};
      if (cp < count) {
        const float4 v0 = *reinterpret_cast<const float4*>(src);
        const float4 v1 = *reinterpret_cast<const float4*>(src + 4);
        v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
      }
      uint32_t h[4], m[4], l[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (SPLIT) {
          split3(v[j], v[j + 4], h[j], m[j], l[j]);  // x == hi + mid + lo exactly
        } else {
          h[j] = bf16x2_bits(__floats2bfloat162_rn(v[j], v[j + 4]));
        }
      }
      unsigned char* dst = xb + (st & 1) * L::kXbBuf + cp * (kBK * 2) + cc * 16;
      *reinterpret_cast<uint4*>(dst) = make_uint4(h[0], h[1], h[2], h[3]);
      if constexpr (L::kXTerms > 1) *reinterpret_cast<uint4*>(dst + L::kXbPlane) = make_uint4(m[0], m[1], m[2], m[3]);
      if constexpr (L::kXTerms > 2) {
        *reinterpret_cast<uint4*>(dst + 2 * L::kXbPlane) = make_uint4(l[0], l[1], l[2], l[3]);
      }
      if constexpr (kQuant) {
        if (cvt_pos == 0) run = 0.0f;
        run += ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
        if (++cvt_pos == spg) {  // uniform over the block: every lane takes part in the shuffles
          cvt_pos = 0;
          float s = run + __shfl_xor_sync(0xffffffffu, run, 1);
          s += __shfl_xor_sync(0xffffffffu, s, 2);
          if (cc == 0) xsum[(st & 1) * kBN + cp] = s;
        }
      }
    };

    // A warp whose 32 pairs or 32 rows are all past the tile's end only joins the loads and barriers.
    const bool warp_live = count > 32 * wn && wrow0 < out;
    float acc[2][4][4], part[2][4][4];  // part: this group's sum of (q - z) x, or this slice's sum of w x (dense)
#pragma unroll
    for (int mf = 0; mf < 2; ++mf)
#pragma unroll
      for (int nf = 0; nf < 4; ++nf)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mf][nf][i] = part[mf][nf][i] = 0.0f;

    auto compute = [&](int s) {
      const bool group_first = cmp_pos == 0;
      const bool group_end = kQuant && ++cmp_pos == spg;
      float sc[2][2] = {}, bi[2][2] = {};
      if (group_end) {  // issued before the MMAs, which hide the latency
        cmp_pos = 0;
        const int grp = cmp_grp++;
#pragma unroll
        for (int mf = 0; mf < 2; ++mf)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (srb > 0) {  // this warp's rows of the staged block (up's rows follow gate's with the GLU)
              const unsigned char* sr = ssm + (32 * wm + 16 * mf + grp_id + 8 * h) * srb + grp * int(sizeof(ST));
              sc[mf][h] = to_f32(*reinterpret_cast<const ST*>(sr));
              bi[mf][h] = fmaf(kCodeZero, sc[mf][h], to_f32(*reinterpret_cast<const ST*>(sr + kBM * srb)));
              continue;
            }
            // 32-bit offsets (out * groups < 2^31, mma_gemm_supported); rows past `out` read the last one.
            const int row = min(int(wrow0) + 16 * mf + grp_id + 8 * h, int(out) - 1);
            const int off = row * int(groups) + grp;
            sc[mf][h] = to_f32(__ldg(sbase + off));
            // The codes were centered: b + z s multiplies sum(x). One f32 rounding, as in fma(s, q, b).
            bi[mf][h] = fmaf(kCodeZero, sc[mf][h], bbase ? to_f32(__ldg(bbase + off)) : 0.0f);
          }
      }
      // A fragments of both k16 steps. Shared loads: 4-bit rows are 16 bytes, so the 32 lanes' words (row
      // grp_id, word tig) are 32 consecutive words; 8-bit: each half-warp reads 128 consecutive bytes; bf16:
      // each quarter-warp reads 128 consecutive bytes.
      const unsigned char* ws = wq + (s % kStages) * (kBM * kRowBytes<F>);
      uint32_t af[2][2][4];
#pragma unroll
      for (int mf = 0; mf < 2; ++mf) {
        const int r = 32 * wm + 16 * mf + grp_id;
        const unsigned char* p0 = ws + r * kRowBytes<F>;
        const unsigned char* p1 = p0 + 8 * kRowBytes<F>;
        if constexpr (F == Fmt::kQ4) {
          const uint32_t w0 = reinterpret_cast<const uint32_t*>(p0)[tig];
          const uint32_t w1 = reinterpret_cast<const uint32_t*>(p1)[tig];
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const uint32_t wv = (i & 1) ? w1 : w0;
              af[mf][ks][i] = L::kF16 ? q4_pair_f16(wv, 2 * ks + (i >> 1)) : q4_pair(wv, 2 * ks + (i >> 1));
            }
          }
        } else if constexpr (F == Fmt::kQ8) {
          const uint2 u0 = reinterpret_cast<const uint2*>(p0)[tig];
          const uint2 u1 = reinterpret_cast<const uint2*>(p1)[tig];
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const uint2 u = (i & 1) ? u1 : u0;
              af[mf][ks][i] = L::kF16 ? q8_pair_f16(u.x, u.y, 2 * ks + (i >> 1)) : q8_pair(u.x, u.y, 2 * ks + (i >> 1));
            }
          }
        } else {
          const uint4 u0 = reinterpret_cast<const uint4*>(p0)[tig];
          const uint4 u1 = reinterpret_cast<const uint4*>(p1)[tig];
#pragma unroll
          for (int ks = 0; ks < 2; ++ks) {
            af[mf][ks][0] = bf16_pair(u0, 2 * ks);
            af[mf][ks][1] = bf16_pair(u1, 2 * ks);
            af[mf][ks][2] = bf16_pair(u0, 2 * ks + 1);
            af[mf][ks][3] = bf16_pair(u1, 2 * ks + 1);
          }
        }
      }
      // B fragments: one 16-byte load per lane (pair grp_id of the fragment, chunk tig) gives both k16 steps;
      // rows of xb are 64 bytes, so each quarter-warp (2 pairs x 4 chunks) reads 128 consecutive bytes.
      // Straight-line code over all fragments (no per-fragment branches), so the scheduler can interleave the
      // 8 independent accumulator chains; columns past `count` compute garbage that is never stored.
      const unsigned char* xs = xb + (L::kF16 ? s % kStages : s & 1) * L::kXbBuf;
      // kFresh: the slice starts a group (f16 split), so its first MMA starts from zero instead of a zeroed `part`.
      auto mmas = [&](auto fresh) {
        [[maybe_unused]] constexpr bool kFresh = decltype(fresh)::value;
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
          const unsigned char* bp = xs + (32 * wn + 8 * nf + grp_id) * (kBK * 2) + 16 * tig;
          const uint4 bh = *reinterpret_cast<const uint4*>(bp);
          [[maybe_unused]] uint4 bm = {}, bl = {};
          if constexpr (L::kXTerms > 1) bm = *reinterpret_cast<const uint4*>(bp + L::kXbPlane);
          if constexpr (L::kXTerms > 2) bl = *reinterpret_cast<const uint4*>(bp + 2 * L::kXbPlane);
#pragma unroll
          for (int mf = 0; mf < 2; ++mf) {
            float* d = part[mf][nf];
            if constexpr (L::kF16) {
              if constexpr (kFresh) {
                mma_f16_zero(d, af[mf][0], bh.x, bh.y);
              } else {
                mma_f16(d, af[mf][0], bh.x, bh.y);
              }
              mma_f16(d, af[mf][1], bh.z, bh.w);
              mma_f16(d, af[mf][0], bm.x, bm.y);
              mma_f16(d, af[mf][1], bm.z, bm.w);
              continue;
            }
            mma_bf16(d, af[mf][0], bh.x, bh.y);
            mma_bf16(d, af[mf][1], bh.z, bh.w);
            if constexpr (SPLIT) {
              mma_bf16(d, af[mf][0], bm.x, bm.y);
              mma_bf16(d, af[mf][1], bm.z, bm.w);
              mma_bf16(d, af[mf][0], bl.x, bl.y);
              mma_bf16(d, af[mf][1], bl.z, bl.w);
            }
          }
        }
      };
      if (L::kF16 && group_first) {
        mmas(std::true_type{});
      } else {
        mmas(std::false_type{});
      }
      if (group_end) {  // acc += s * sum((q - z) x) + (b + z s) * sum(x), per (row, pair); then part restarts
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
          const int buf = L::kF16 ? s % kStages : s & 1;
          const float2 xs2 = *reinterpret_cast<const float2*>(xsum + buf * kBN + 32 * wn + 8 * nf + 2 * tig);
#pragma unroll
          for (int mf = 0; mf < 2; ++mf)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int h = i >> 1;
              const float xv = (i & 1) ? xs2.y : xs2.x;
              acc[mf][nf][i] = fmaf(sc[mf][h], part[mf][nf][i], fmaf(bi[mf][h], xv, acc[mf][nf][i]));
              if constexpr (!L::kF16) part[mf][nf][i] = 0.0f;  // the f16 split restarts with a fresh MMA
            }
        }
      } else if constexpr (!kQuant) {  // dense: acc += part per slice (short truncating MMA chains, see above)
#pragma unroll
        for (int mf = 0; mf < 2; ++mf)
#pragma unroll
          for (int nf = 0; nf < 4; ++nf)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              acc[mf][nf][i] += part[mf][nf][i];
              part[mf][nf][i] = 0.0f;
            }
      }
    };

    // The tile's scale and bias rows, in the first commit group (complete before any group's end).
    if constexpr (L::kF16) {
      if (srb > 0) {
        const int chunks = int(groups) * int(sizeof(ST)) / 16, per_array = kBM * chunks;
        for (int i = tid; i < 2 * per_array; i += kThreads) {
          const int arr = i / per_array, r = (i % per_array) / chunks, c = i % chunks;
          const WeightView& wv = glu && r >= kBM / 2 ? a.w1 : w;
          const int64_t row = row0 + (glu ? r % (kBM / 2) : r);
          const void* base = arr == 0 ? wv.scales : wv.biases;
          const bool valid = base != nullptr && row < out;
          const unsigned char* src =
              valid ? static_cast<const unsigned char*>(base) + ((expert * out + row) * groups) * sizeof(ST) + 16 * c
                    : static_cast<const unsigned char*>(wv.scales);
          cp_async16(smem_addr(ssm + (arr * kBM + r) * srb + 16 * c), src, valid);
        }
      }
    }
    // Pipeline: slices 0 .. kStages-2 in flight, slice 0 converted. Iteration s: slice s + 1 has landed
    // (wait), the barrier publishes it and retires every reader of slot (s - 1) % kStages and of xb[(s + 1) & 1];
    // then slice s + kStages - 1 is issued into that slot, slice s + 1 converted, slice s multiplied.
#pragma unroll 1
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < n_steps) issue(st);
      cp_async_commit();  // empty groups keep the wait counts uniform
    }
    if constexpr (L::kF16) {  // x arrives split: iteration s waits for slice s itself
#pragma unroll 1
      for (int s = 0; s < n_steps; ++s) {
        cp_async_wait<kStages - 2>();
        __syncthreads();  // slice s is visible to every warp, and every warp is done with slot (s - 1) % kStages
        if (s + kStages - 1 < n_steps) issue(s + kStages - 1);
        cp_async_commit();
        if (warp_live) compute(s);
      }
    } else {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      convert(0);
#pragma unroll 1
      for (int s = 0; s < n_steps; ++s) {
        cp_async_wait<kStages - 3>();
        __syncthreads();
        if (s + kStages - 1 < n_steps) issue(s + kStages - 1);
        cp_async_commit();
        if (s + 1 < n_steps) convert(s + 1);
        if (warp_live) compute(s);
      }
    }

    // C fragment (row grp_id (+8), pairs 2 tig + {0,1}) -> y[pair, row]: 8 consecutive rows per pair and store.
    if (glu) {  // the up warps hand their values to the gate warps through shared memory (xb is free now)
      float* ub = reinterpret_cast<float*>(xb);
      static_assert(size_t(kBM / 2) * kGluLd * 4 <= size_t(kStages) * Layout<Fmt::kQ4, true>::kXbBuf, "GLU stage");
      __syncthreads();  // every warp is done with xb
      if (warp_live && up_warp) {
#pragma unroll
        for (int mf = 0; mf < 2; ++mf)
#pragma unroll
          for (int nf = 0; nf < 4; ++nf)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int col = 32 * wn + 8 * nf + 2 * tig + (i & 1);
              const int r = 32 * (wm & 1) + 16 * mf + grp_id + 8 * (i >> 1);
              ub[r * kGluLd + col] = acc[mf][nf][i] * xsc[col].y;
            }
      }
      __syncthreads();
      if (warp_live && !up_warp) {
#pragma unroll
        for (int mf = 0; mf < 2; ++mf)
#pragma unroll
          for (int nf = 0; nf < 4; ++nf)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int col = 32 * wn + 8 * nf + 2 * tig + (i & 1);
              const int r = 32 * (wm & 1) + 16 * mf + grp_id + 8 * (i >> 1);
              const int pair = pair_of[col];
              const int64_t row = row0 + r;
              const float g = acc[mf][nf][i] * xsc[col].y;
              if (pair >= 0 && row < out) y[int64_t(pair) * out + row] = glu_of(a.glu, g, ub[r * kGluLd + col]);
            }
      }
    } else if (warp_live) {
#pragma unroll
      for (int mf = 0; mf < 2; ++mf)
#pragma unroll
        for (int nf = 0; nf < 4; ++nf) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int col = 32 * wn + 8 * nf + 2 * tig + (i & 1);
            const int pair = pair_of[col];
            const int64_t row = wrow0 + 16 * mf + grp_id + 8 * (i >> 1);
            float v = acc[mf][nf][i];
            if constexpr (L::kF16) v *= xsc[col].y;  // undo the row scale: exact
            if (pair >= 0 && row < out) y[int64_t(pair) * out + row] = v;
          }
        }
    }
  }
}

template <Fmt F, typename ST, bool SPLIT>
void launch_typed(const Ctx& ctx, dim3 grid, const MmaArgs& a) {
  constexpr size_t kLayout = Layout<F, SPLIT>::kBytes;
  // The attribute covers the largest staged scale block, so one opt-in serves every launch.
  constexpr size_t kSmem = kLayout + (Layout<F, SPLIT>::kF16 ? kMaxStagedScaleBytes : 0);
  // Opt in to more than 48 KB of dynamic shared memory once per instantiation.
  static const bool opted_in = [] {
    CUDA_CHECK(
        cudaFuncSetAttribute(mma_gemm_kernel<F, ST, SPLIT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    return true;
  }();
  (void)opted_in;
  mma_gemm_kernel<F, ST, SPLIT><<<grid, kThreads, kSmem, ctx.stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <Fmt F, bool SPLIT>
void launch_scaled(const Ctx& ctx, dim3 grid, const MmaArgs& a) {
  switch (a.w.stype) {
    case FloatType::kF32: launch_typed<F, float, SPLIT>(ctx, grid, a); break;
    case FloatType::kF16: launch_typed<F, __half, SPLIT>(ctx, grid, a); break;
    case FloatType::kBF16: launch_typed<F, __nv_bfloat16, SPLIT>(ctx, grid, a); break;
  }
}

template <bool SPLIT>
void launch_format(const Ctx& ctx, dim3 grid, const MmaArgs& a) {
  if (a.w.bits == 4) {
    launch_scaled<Fmt::kQ4, SPLIT>(ctx, grid, a);
  } else if (a.w.bits == 8) {
    launch_scaled<Fmt::kQ8, SPLIT>(ctx, grid, a);
  } else {
    launch_typed<Fmt::kBF16, float, SPLIT>(ctx, grid, a);  // ST unused for dense weights
  }
}

size_t smem_bytes(int bits, bool split) {
  if (bits == 4) return split ? Layout<Fmt::kQ4, true>::kBytes : Layout<Fmt::kQ4, false>::kBytes;
  if (bits == 8) return split ? Layout<Fmt::kQ8, true>::kBytes : Layout<Fmt::kQ8, false>::kBytes;
  return split ? Layout<Fmt::kBF16, true>::kBytes : Layout<Fmt::kBF16, false>::kBytes;
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// MmaArgs::scale_row_bytes for quantized weights with the f16 split: staged when every weight's scale rows are a
// multiple of 16 bytes (16-byte copies) of at most kMaxStagedScaleRow bytes and the block fits the opt-in limit.
int staged_scale_row(const Ctx& ctx, std::span<const WeightView> ws) {
  int row = 0;
  for (const WeightView& w : ws) {
    const int64_t rb = (w.in / w.group_size) * (w.stype == FloatType::kF32 ? 4 : 2);
    if (rb % 16 != 0 || rb > kMaxStagedScaleRow || !aligned16(w.scales) || (w.biases && !aligned16(w.biases))) return 0;
    if (row != 0 && rb + 16 != row) return 0;
    row = int(rb + 16);
  }
  const size_t layout = ws.empty() || ws[0].bits == 4 ? Layout<Fmt::kQ4, true>::kBytes : Layout<Fmt::kQ8, true>::kBytes;
  return layout + size_t(2) * kBM * size_t(row) <= size_t(ctx.max_smem_optin) ? row : 0;
}

bool mma_gemm_supported(const Ctx& ctx, const WeightView& w, const float* x, MmaPrecision precision) {
  if (!aligned16(w.w) || !aligned16(x) || w.in <= 0) return false;
  if (w.bits == 4 || w.bits == 8) {
    if (w.in % kBK != 0 || w.group_size <= 0 || w.group_size % kBK != 0) return false;
    if (w.out * (w.in / w.group_size) >= (int64_t(1) << 31)) return false;  // 32-bit scale offsets
  } else if (w.bits == 0) {
    if (w.wtype != FloatType::kBF16 || w.in % 8 != 0) return false;
  } else {
    return false;
  }
  return smem_bytes(w.bits, precision == MmaPrecision::kSplitX) <= size_t(ctx.max_smem_optin);
}

}  // namespace

bool launch_gemm_mma(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs,
                     const TileList* tiles, int64_t max_tiles, float* y, MmaPrecision precision, void* scratch) {
  if (n_pairs == 0 || w.out == 0) return true;
  if (!mma_gemm_supported(ctx, w, x, precision)) return false;
  CUDA_REQUIRE(n_pairs > 0 && n_pairs < (int64_t(1) << 31), "gemm (mma): bad pair count");
  const int64_t row_blocks = (w.out + kBM - 1) / kBM;
  const int64_t tile_blocks = tiles ? max_tiles : (n_pairs + kBN - 1) / kBN;
  CUDA_REQUIRE(row_blocks < (int64_t(1) << 31), "gemm (mma): too many output rows");
  const dim3 grid{unsigned(row_blocks), unsigned(std::min<int64_t>(std::max<int64_t>(tile_blocks, 1), 65535))};
  MmaArgs a{w, x, y, map, n_pairs, tiles ? *tiles : TileList{}, max_tiles};
  if (precision == MmaPrecision::kSplitX && w.bits != 0) {
    a.sx =
        launch_split_x(ctx, x, map.x_per_slot ? n_pairs : (n_pairs + map.k - 1) / map.k, w.in, w.group_size, scratch);
    a.scale_row_bytes = staged_scale_row(ctx, std::span(&w, 1));
  }
  if (precision == MmaPrecision::kSplitX) {
    launch_format<true>(ctx, grid, a);
  } else {
    launch_format<false>(ctx, grid, a);
  }
  return true;
}

bool mma_glu_supported(const Ctx& ctx, const WeightView& gate, const WeightView& up, const float* x) {
  return (gate.bits == 4 || gate.bits == 8) && up.bits == gate.bits && up.in == gate.in && up.out == gate.out &&
         up.group_size == gate.group_size && up.stype == gate.stype && up.n_stack == gate.n_stack &&
         mma_gemm_supported(ctx, gate, x, MmaPrecision::kSplitX) &&
         mma_gemm_supported(ctx, up, x, MmaPrecision::kSplitX);
}

void launch_gemm_mma_glu(const Ctx& ctx, const WeightView& gate, const WeightView& up, GluAct act, const float* x,
                         const PairMap& map, int64_t n_pairs, const TileList& tiles, int64_t max_tiles, float* y,
                         void* scratch) {
  CUDA_REQUIRE(mma_glu_supported(ctx, gate, up, x), "gemm (mma): gate and up must share a 4-/8-bit format");
  if (n_pairs == 0 || gate.out == 0) return;
  CUDA_REQUIRE(n_pairs > 0 && n_pairs < (int64_t(1) << 31), "gemm (mma): bad pair count");
  const int64_t row_blocks = (gate.out + kBM / 2 - 1) / (kBM / 2);
  CUDA_REQUIRE(row_blocks < (int64_t(1) << 31), "gemm (mma): too many output rows");
  MmaArgs a{gate, x, y, map, n_pairs, tiles, max_tiles};
  a.w1 = up;
  a.glu = int(act);
  a.sx = launch_split_x(ctx, x, map.x_per_slot ? n_pairs : (n_pairs + map.k - 1) / map.k, gate.in, gate.group_size,
                        scratch);
  const WeightView both[2] = {gate, up};
  a.scale_row_bytes = staged_scale_row(ctx, both);
  const dim3 grid{unsigned(row_blocks), unsigned(std::min<int64_t>(std::max<int64_t>(max_tiles, 1), 65535))};
  launch_format<true>(ctx, grid, a);
}

bool launch_gemm_mma_parts(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys, const float* x,
                           int64_t n_tokens, MmaPrecision precision, void* scratch) {
  CUDA_REQUIRE(!ws.empty() && ws.size() <= 3 && ys.size() == ws.size(), "gemm (mma): 1 to 3 weights, one output each");
  const WeightView& w = ws[0];
  for (const WeightView& v : ws) {
    if (v.in != w.in || v.bits != w.bits || v.group_size != w.group_size || v.stype != w.stype || v.wtype != w.wtype ||
        v.n_stack != 1 || !mma_gemm_supported(ctx, v, x, precision)) {
      return false;
    }
  }
  if (n_tokens == 0) return true;
  CUDA_REQUIRE(n_tokens > 0 && n_tokens < (int64_t(1) << 31), "gemm (mma): bad token count");
  MmaArgs a{w, x, ys[0], PairMap{nullptr, 1, true}, n_tokens, TileList{}, 0};
  if (precision == MmaPrecision::kSplitX && w.bits != 0) {
    a.sx = launch_split_x(ctx, x, n_tokens, w.in, w.group_size, scratch);
    a.scale_row_bytes = staged_scale_row(ctx, ws);
  }
  a.n_parts = int(ws.size());
  int64_t blocks = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    blocks += (ws[i].out + kBM - 1) / kBM;
    CUDA_REQUIRE(blocks < (int64_t(1) << 31), "gemm (mma): too many output rows");
    if (i < 2) a.part_end[i] = unsigned(blocks);
  }
  if (ws.size() > 1) {
    a.w1 = ws[1];
    a.y1 = ys[1];
  }
  if (ws.size() > 2) {
    a.w2 = ws[2];
    a.y2 = ys[2];
  }
  const dim3 grid{unsigned(blocks), unsigned(std::min<int64_t>((n_tokens + kBN - 1) / kBN, 65535))};
  if (precision == MmaPrecision::kSplitX) {
    launch_format<true>(ctx, grid, a);
  } else {
    launch_format<false>(ctx, grid, a);
  }
  return true;
}

}  // namespace moecel::cuda
