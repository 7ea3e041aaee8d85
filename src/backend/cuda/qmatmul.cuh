// Matrix products of the CUDA backend for dense (F32/F16/BF16) and MLX affine-quantized weights:
// linear (y = x @ w^T) and the gather path (MLX gather_qmm: one expert slice per (token, slot) pair).
// Few tokens take the matrix-vector kernels (qgemv.cu: 1-4 output rows per warp, x staged in shared memory);
// more take a tiled kernel (qgemm_mma.cu: tensor cores, 4-/8-bit and BF16 weights; qgemm.cu: CUDA cores, any
// weight), where a weight tile staged in shared memory is reused by 64 tokens.
// Used by: CudaBackend::linear, CudaBackend::gather_linear.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/moe.cuh"

namespace moecel::cuda {

// A validated weight on the device, by raw pointers. Quantized: w U32 packed
// (n_stack, out, in * bits / 32); scales, biases (n_stack, out, in / group_size) of type stype (biases may be
// null: zero). Dense (bits == 0): w (n_stack, out, in) of type wtype. n_stack >= 1 (1 for a plain 2-D weight).
struct WeightView {
  const void* w = nullptr;
  const void* scales = nullptr;
  const void* biases = nullptr;
  FloatType wtype = FloatType::kF32;
  FloatType stype = FloatType::kF32;
  int64_t n_stack = 1, out = 0, in = 0;
  int bits = 0;  // 0 = dense
  int group_size = 0;
};

// Rows from which MOECEL_CUDA_DECODE_MMA=2 (the default) takes the tensor-core kernels: the vocabulary projection
// (docs/benchmarks.md: 34 vs 42 us for OLMoE's 50,304 x 2,048), not the smaller products, where they are slower.
constexpr int64_t kMmaAutoRows = 16384;

// Whether the tensor-core matrix-vector kernels (gemv_mma.cuh) take this weight: 4 or 8 bits, group size 32, 64
// or 128, a 16-byte aligned packed weight, and the mode (Ctx::decode_mma). The plain and the fused decode paths
// ask the same question of the same weight, so they always run the same arithmetic.
inline bool decode_mma_applies(const Ctx& ctx, const WeightView& w) {
  const bool mode = ctx.decode_mma == 1 || (ctx.decode_mma == 2 && w.n_stack == 1 && w.out >= kMmaAutoRows);
  return mode && (w.bits == 4 || w.bits == 8) && (w.group_size == 32 || w.group_size == 64 || w.group_size == 128) &&
         w.in > 0 && w.in % w.group_size == 0 && reinterpret_cast<uintptr_t>(w.w) % 16 == 0;
}

// Up to this many tokens a weight slice is streamed once per token by the matrix-vector kernels.
constexpr int64_t kGemvMaxTokens = 4;

// Device scratch bytes launch_linear needs for n_tokens rows of x.
size_t linear_scratch_bytes(const WeightView& w, int64_t n_tokens);

// y (n_tokens, out) = x (n_tokens, in) @ w[0]^T. `scratch` holds linear_scratch_bytes(n_tokens) bytes.
void launch_linear(const Ctx& ctx, const WeightView& w, const float* x, int64_t n_tokens, float* y, void* scratch);

// Device scratch bytes launch_gather_linear needs for n_tokens * k pairs (the routing tables).
size_t gather_scratch_bytes(const WeightView& w, int64_t n_tokens, int64_t k);

// indices I32 (n_tokens, k) on the device; x (n_tokens, in), or (n_tokens, k, in) when x_per_slot;
// y (n_tokens, k, out): y[t, j] = w[indices[t, j]] @ x[t (, j)]. An index outside [0, n_stack) raises
// kErrExpertIndex and fills its output row with NaN. `scratch` holds gather_scratch_bytes(...) bytes.
void launch_gather_linear(const Ctx& ctx, const WeightView& w, const float* x, bool x_per_slot, const int32_t* indices,
                          int64_t n_tokens, int64_t k, float* y, void* scratch, bool indices_final = false);

// The first half of a GLU expert block's gather path: y (n_tokens, k, out) = act(gate[e] @ x[t]) * (up[e] @ x[t]),
// e = indices[t, j], x (n_tokens, in), with one routing kernel and one tensor-core launch (the activation in its
// epilogue), bit for bit what launch_gather_linear of gate and of up and launch_glu give. Returns false, launching
// nothing, where those would not take the tensor-core kernel with split x (few tokens, MOECEL_CUDA_MMA=0 or fast,
// other formats) or gate and up differ in shape or format. `scratch`: gather_scratch_bytes(gate, n_tokens, k).
bool launch_gather_glu(const Ctx& ctx, const WeightView& gate, const WeightView& up, GluAct act, const float* x,
                       const int32_t* indices, int64_t n_tokens, int64_t k, float* y, void* scratch);

// ---- decode fusions of the matrix-vector kernel (CudaBackend::rms_norm_linears, linear_residual,
// rms_norm_router): fewer launches per decode step, the same per-row arithmetic ----
constexpr int kMaxGemvParts = 3;  // e.g. q, k and v in one launch

// Top-k of the logits the launch writes, by its last block (block_router_topk: up to 256 experts, k <= 32).
struct RouterEpilogue {
  int k = 0;  // 0: none
  bool topk_softmax = false, renormalize = false;
  int32_t* indices = nullptr;  // (n_tokens, k)
  float* weights = nullptr;    // (n_tokens, k)
};

// The routed form of a router share (CudaBackend::linear_residual_router_fused_moe_add, one token): each block also
// adds its parts into words[e] as 64-bit fixed point (2^-32 units, by atomics: integer sums do not depend on their
// order) and raises words[n_experts] where a part is NaN or not below `limit` (then the sum could overflow; the
// readers fall back to the float parts), and block 0 empties the k slots. Kernel A's blocks rank the words themselves
// (fused_moe.cuh, FusedMoeArgs::route); kernel B's block 0 zeroes them again.
constexpr uint64_t kRouteSlotEmpty = ~uint64_t(0);  // a slot: (weight bits << 32) | expert; empty: expert 0xffffffff
struct RouteWords {
  unsigned long long* words = nullptr;  // (n_experts + 1); nullptr: not routed
  unsigned long long* slots = nullptr;  // (k)
  int k = 0;
  float limit = 0.0f;  // 2^31 / blocks
};

// The share of the router after an output projection that the projection's blocks compute (CudaBackend::
// linear_residual_norm_router): block b, owning rows R_b of y (after the residual add), writes
// parts[t][b][e] = sum_{r in R_b} router[e, r] * norm_w[r] * y[t, r] for every expert e and sumsq[t][b] =
// sum_{r in R_b} y[t, r]^2; launch_router_reduce_topk sums them in block order. Since rms_norm scales a row by one
// factor, the logits are that factor times the summed parts: no launch of its own for the router's product.
struct RouterShare {
  WeightView w;                  // router (n_experts <= 256, d), 4 or 8 bits, group size a multiple of 16
  const void* norm_w = nullptr;  // the norm weight (d,)
  FloatType norm_type = FloatType::kF32;
  float* parts = nullptr;  // (n_tokens, blocks, n_experts); nullptr: no share
  float* sumsq = nullptr;  // (n_tokens, blocks)
  int rows = 16;           // the projection's rows per part: share_rows(d_in)
  RouteWords route;        // also added into the route's words (one token)
};
// The projection's rows per block with a share: 16 (2 per warp), or 8 where a row is longer than the 2048 values
// a warp loads before its wait with 2 rows (more blocks, each row's weights all loaded before the wait).
inline int share_rows(int64_t in) {
  return in > 2048 ? 8 : 16;
}
// Most parts per token (blocks x n_experts) with which the share is used: the reduction's block then loads at most
// 32 per thread, one round trip. OLMoE (128 blocks x 64 experts) gains with it on the H200 (1,383 -> 1,423 tok/s),
// Qwen3-30B-A3B (128 or 256 blocks x 128 experts) measured slower (384 and 372 vs 405 tok/s).
constexpr int64_t kMaxShareParts = 8192;

// A greedy step's argmax folded into the streaming kernel of its vocabulary projection (one token; a parameter of
// those kernels alone: inside GemvFusion it measured 0.7% slower on the gather path): each block writes
// the best (value, index) of its rows to the partials, and the block that finishes last reduces them and publishes
// the id as launch_argmax does (misc.cuh: out, the step position `advance`, the host words).
struct ArgmaxTail {
  int32_t* out = nullptr;  // set: the tail runs
  float* part_v = nullptr;
  int* part_i = nullptr;
  int max_parts = 0;  // entries of part_v and part_i: the grid may not be larger
  unsigned* counter = nullptr;
  int64_t* advance = nullptr;
  int32_t* host_out = nullptr;
};

struct GemvFusion {
  const void* norm_w = nullptr;  // x is rms-normalized with this weight (d,) while staged
  FloatType norm_type = FloatType::kF32;
  float eps = 0.0f;
  float* xn_out = nullptr;          // and the normalized x written here (n_tokens, d)
  const float* residual = nullptr;  // y = residual + x @ w^T (residual may be y)
  RouterEpilogue router;
  unsigned* counter = nullptr;  // ctx.block_counter, for the router epilogue
  RouterShare share;
  bool active() const { return norm_w || residual || router.k > 0 || share.parts; }
};

// The router after a projection with a RouterShare: per token, logits[e] = inv * sum_b parts[b][e] and xn = y *
// inv * norm_w with inv = 1 / sqrt(sum_b sumsq[b] / d + eps), then the top-k (block_router_topk) -> indices,
// weights. One block per token.
struct RouterReduce {
  const float* parts = nullptr;  // (n_tokens, blocks, n_experts)
  const float* sumsq = nullptr;  // (n_tokens, blocks)
  int blocks = 0;
  const float* y = nullptr;  // the projection's output (n_tokens, d)
  const void* norm_w = nullptr;
  FloatType norm_type = FloatType::kF32;
  float eps = 0.0f;
  int64_t d = 0;
  int n_experts = 0, k = 0;
  bool topk_softmax = false, renormalize = false;
  float* xn = nullptr;      // (n_tokens, d)
  float* logits = nullptr;  // (n_tokens, n_experts)
  int32_t* indices = nullptr;
  float* weights = nullptr;  // (n_tokens, k)
};
void launch_router_reduce_topk(const Ctx& ctx, const RouterReduce& r, int64_t n_tokens);

// ys[i] (n_tokens, out_i) = (fused x) @ ws[i]^T for up to kMaxGemvParts quantized weights sharing in, bits, group
// size and scale type, in one launch. residual and router need a single weight. Returns false (launching nothing)
// for more than kGemvMaxTokens tokens, dense weights, or an x too long for shared memory: the caller then runs
// the ops one by one. With an argmax tail (one token and one weight): false also where the streaming kernel declines.
bool launch_gemv_fused(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys, const float* x,
                       int64_t n_tokens, const GemvFusion& f, const ArgmaxTail* tail = nullptr);

// ---- internal: the two kernel families, launched by qmatmul.cu ----

// Pair p of a matrix-vector launch reads expert indices[p] (0 when indices is null), x row
// (x_per_slot ? p : p / k) and writes y row p.
struct PairMap {
  const int32_t* indices = nullptr;
  int64_t k = 1;
  bool x_per_slot = true;
  // The indices' writer finished before the previous kernel passed its wait (which it does before letting this one
  // start): the bulk kernel reads them, and issues its weight copies, before its own wait.
  bool indices_final = false;
};
// Returns false (launching nothing) when x does not fit in shared memory; the caller then uses the tiled path.
bool launch_gemv(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs, float* y);
// The gather products of several weights sharing in, bits, group size and scale type (a SwitchGLU's gate and up) on
// one token's x rows in one launch: ys[i] (n_tokens * k, ws[i].out) as launch_gemv gives each (the same bits).
// Returns false (launching nothing) when x does not fit in shared memory.
bool launch_gather_gemv_parts(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys,
                              const float* x, const int32_t* indices, int64_t n_tokens, int64_t k);
// The same for gate and up with the activation in the epilogue: y (n_tokens * k, gate.out) = act(gate rows) * up
// rows, bit for bit launch_gather_gemv_parts then launch_glu, by the bulk-copy kernel (gemv_bulk.cu). Returns false
// (launching nothing) where that kernel does not take them (Ctx::gemv_bulk_gather off, formats, shapes).
bool launch_gather_glu_gemv(const Ctx& ctx, const WeightView& gate, const WeightView& up, GluAct act, const float* x,
                            const int32_t* indices, int64_t n_tokens, int64_t k, float* y);

// Work list of the tiled kernel: tile i covers pairs order[start[i] .. start[i] + count[i]) of expert
// expert[i]; *n_tiles says how many entries are valid (written on the device by the routing kernel).
struct TileList {
  const int32_t* order = nullptr;  // (n_pairs,) pair ids grouped by expert
  const int32_t* expert = nullptr;
  const int32_t* start = nullptr;
  const int32_t* count = nullptr;
  const int32_t* n_tiles = nullptr;
};
constexpr int kGemmTileTokens = 64;  // pairs per tile
// Device scratch bytes of the tiled product for x_rows rows of x of length in (the tensor-core kernel's split x).
size_t gemm_scratch_bytes(int64_t x_rows, int64_t in);
// Tiled product. With tiles == nullptr: a plain linear over n_pairs tokens (expert 0, pair p = token p);
// otherwise max_tiles bounds the tile count the routing kernel may produce. Runs the tensor-core kernel where it
// applies (4-/8-bit affine and dense BF16 weights), else the CUDA-core one. MOECEL_CUDA_MMA selects: unset or 1:
// tensor cores with x split into 16-bit terms (matches f32); fast: tensor cores with x rounded to bf16; 0: CUDA
// cores. `scratch` holds gemm_scratch_bytes(rows of x) bytes.
void launch_gemm(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs,
                 const TileList* tiles, int64_t max_tiles, float* y, void* scratch);
// The CUDA-core tiled kernel (qgemm.cu): every bits value and dense dtype.
void launch_gemm_simt(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs,
                      const TileList* tiles, int64_t max_tiles, float* y);
// How the tensor-core kernel rounds x (f32) to its bf16 operand (error analysis in qgemm_mma.cu).
enum class MmaPrecision : int {
  kSplitX = 0,  // row-scaled x = hi + lo in f16 (quantized weights; 22 bits of x) or hi + mid + lo in bf16 (dense)
  kBf16X = 1,   // x = bf16(x): ~2e-6 normalized MSE, a third of the tensor work
};
// x split for the tensor-core kernel with quantized weights (split_x.cu), per row of x: planes (rows, in / 32, 2, 32)
// f16 (hi then lo per 32-slice, fragment order), scale (2^e, 2^-e), gsum (rows, in / group_size) sums of the scaled
// row per group. Written into `scratch` (gemm_scratch_bytes(rows, in) bytes).
struct SplitX {
  const unsigned char* planes = nullptr;
  const float2* scale = nullptr;
  const float* gsum = nullptr;
};
SplitX launch_split_x(const Ctx& ctx, const float* x, int64_t rows, int64_t in, int group_size, void* scratch);
// The tensor-core tiled kernel (qgemm_mma.cu). Returns false, launching nothing, when the weight or x does not
// meet its preconditions (bits 4 or 8 with in and group_size multiples of 32, or dense BF16 with in % 8 == 0;
// 16-byte aligned w and x; enough shared memory).
bool launch_gemm_mma(const Ctx& ctx, const WeightView& w, const float* x, const PairMap& map, int64_t n_pairs,
                     const TileList* tiles, int64_t max_tiles, float* y, MmaPrecision precision, void* scratch);
// Whether launch_linear tries the matrix-vector kernel first for this weight and token count (few tokens, or a
// matrix short enough that the tiled kernel would leave most of the GPU idle).
bool linear_prefers_gemv(const WeightView& w, int64_t n_tokens);
// Up to three weights of one input (same in, bits, group size and types; not stacked) in one launch of the
// tensor-core kernel, ys[i] = x @ ws[i]^T for n_tokens rows of x. Returns false, launching nothing, where that kernel
// does not take them.
bool launch_gemm_mma_parts(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys, const float* x,
                           int64_t n_tokens, MmaPrecision precision, void* scratch);
// launch_gemm_mma_parts at the precision MOECEL_CUDA_MMA selects. False, launching nothing, with MOECEL_CUDA_MMA=0,
// where a weight would take the matrix-vector kernel in launch_linear (so results match it), or where the
// tensor-core kernel does not take the weights.
// `scratch` holds linear_scratch_bytes(ws[0], n_tokens) bytes.
bool launch_gemm_parts(const Ctx& ctx, std::span<const WeightView> ws, std::span<float* const> ys, const float* x,
                       int64_t n_tokens, void* scratch);
// Whether launch_gemm_mma_glu takes gate and up (at MmaPrecision::kSplitX), and whether MOECEL_CUDA_MMA selects that
// precision too (gemm_glu_applies).
bool mma_glu_supported(const Ctx& ctx, const WeightView& gate, const WeightView& up, const float* x);
bool gemm_glu_applies(const Ctx& ctx, const WeightView& gate, const WeightView& up, const float* x);
// The tensor-core kernel over gate and up at once (MmaArgs::glu), y = act(gate x) * (up x) per tile pair and row.
void launch_gemm_mma_glu(const Ctx& ctx, const WeightView& gate, const WeightView& up, GluAct act, const float* x,
                         const PairMap& map, int64_t n_pairs, const TileList& tiles, int64_t max_tiles, float* y,
                         void* scratch);
// Groups the pairs by expert and builds the tile list in `scratch` (layout: see qgemm.cu).
TileList launch_route(const Ctx& ctx, const WeightView& w, const int32_t* indices, int64_t n_pairs, float* y,
                      void* scratch, int64_t* max_tiles);
size_t route_scratch_bytes(int64_t n_experts, int64_t n_pairs);

}  // namespace moecel::cuda
