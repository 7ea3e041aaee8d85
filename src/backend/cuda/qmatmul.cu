// Dispatch of the matrix products: the matrix-vector kernels for up to kGemvMaxTokens tokens, the tiled
// kernel beyond (and whenever x is too long for shared memory). The gather path with many tokens first groups
// the (token, slot) pairs by expert on the device, so nothing waits for the host.
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {

// Matrices of at most this many rows take the matrix-vector kernel for any token count: they fill few tiles of the
// tiled kernel (a 64-row router at 512 tokens made 8 blocks of 128 rows x 64 tokens: 97 us on the H200), while the
// matrix-vector kernel runs a block per 8-32 rows and token.
constexpr int64_t kGemvShortRows = 256;

bool linear_prefers_gemv(const WeightView& w, int64_t n_tokens) {
  return n_tokens <= kGemvMaxTokens || (w.out <= kGemvShortRows && w.bits != 0 && n_tokens <= 65535);
}

size_t linear_scratch_bytes(const WeightView& w, int64_t n_tokens) {
  return gemm_scratch_bytes(n_tokens, w.in);
}

void launch_linear(const Ctx& ctx, const WeightView& w, const float* x, int64_t n_tokens, float* y, void* scratch) {
  if (n_tokens == 0 || w.out == 0) return;
  const PairMap map{nullptr, 1, true};  // pair p = token p, expert 0
  if (linear_prefers_gemv(w, n_tokens) && launch_gemv(ctx, w, x, map, n_tokens, y)) return;
  launch_gemm(ctx, w, x, map, n_tokens, nullptr, 0, y, scratch);
}

namespace {
// The gather scratch: the routing tables, then (16-byte aligned) the tiled product's scratch.
size_t route_part_bytes(const WeightView& w, int64_t n_pairs) {
  return (route_scratch_bytes(w.n_stack, n_pairs) + 15) / 16 * 16;
}
}  // namespace

size_t gather_scratch_bytes(const WeightView& w, int64_t n_tokens, int64_t k) {
  return route_part_bytes(w, n_tokens * k) + gemm_scratch_bytes(n_tokens * k, w.in);
}

void launch_gather_linear(const Ctx& ctx, const WeightView& w, const float* x, bool x_per_slot, const int32_t* indices,
                          int64_t n_tokens, int64_t k, float* y, void* scratch, bool indices_final) {
  const int64_t n_pairs = n_tokens * k;
  if (n_pairs == 0 || w.out == 0) return;
  const PairMap map{indices, k, x_per_slot, indices_final};
  // Decode: all pairs (e.g. the k experts of one token) in one launch, grid (rows, pairs).
  if (n_tokens <= kGemvMaxTokens && launch_gemv(ctx, w, x, map, n_pairs, y)) return;
  int64_t max_tiles = 0;
  const TileList tiles = launch_route(ctx, w, indices, n_pairs, y, scratch, &max_tiles);
  launch_gemm(ctx, w, x, map, n_pairs, &tiles, max_tiles, y,
              static_cast<unsigned char*>(scratch) + route_part_bytes(w, n_pairs));
}

bool launch_gather_glu(const Ctx& ctx, const WeightView& gate, const WeightView& up, GluAct act, const float* x,
                       const int32_t* indices, int64_t n_tokens, int64_t k, float* y, void* scratch) {
  const int64_t n_pairs = n_tokens * k;
  // launch_gather_linear's choices for each weight alone: the matrix-vector kernel up to kGemvMaxTokens tokens.
  if (n_tokens <= kGemvMaxTokens || n_pairs == 0 || gate.out == 0 || !gemm_glu_applies(ctx, gate, up, x)) return false;
  int64_t max_tiles = 0;
  const TileList tiles = launch_route(ctx, gate, indices, n_pairs, y, scratch, &max_tiles);
  launch_gemm_mma_glu(ctx, gate, up, act, x, PairMap{indices, k, false}, n_pairs, tiles, max_tiles, y,
                      static_cast<unsigned char*>(scratch) + route_part_bytes(gate, n_pairs));
  return true;
}

}  // namespace moecel::cuda
