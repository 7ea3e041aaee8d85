// The fused single-token decode-MoE kernels (DESIGN.md section 5; docs/fused-moe-decode-kernel-design.md).
// Kernel A: gate and up rows of the k selected experts, dequantized on the fly, the activation, f32 act (k, ffn).
// Kernel B: per hidden row, the k down products and their routing-weighted sum in slot order, one write.
// Used by: CudaBackend::fused_moe.
#pragma once
#include <cstdint>

#include "backend/cuda/moe.cuh"
#include "backend/cuda/qmatmul.cuh"

namespace moecel::cuda {

// The router ranked inside kernels A and B (CudaBackend::linear_residual_router_fused_moe_add, one token): the o
// projection's blocks added their router parts into `words` (RouteWords, qmatmul.cuh); kernel A's blocks read them
// after their wait, rank them (the lower expert first on a tie), stage x = rms_norm(y) * norm_w themselves and take
// the expert of their slot; block (0, 0) writes indices, weights and the slots that kernel B's blocks poll before
// their wait; kernel B's block 0 zeroes the words for the next layer. No router launch between the o projection and
// kernel A. Where words[n_experts] is raised (a part NaN or too large for the fixed point), the float parts are summed
// instead.
struct FusedRoute {
  unsigned long long* words = nullptr;  // (n_experts + 1); nullptr: indices and weights come from a router launch
  unsigned long long* slots = nullptr;  // (k): (weight bits << 32) | expert, or kRouteSlotEmpty
  const float* parts = nullptr;         // (blocks, n_experts): the same parts in f32
  int blocks = 0, n_experts = 0;        // n_experts <= kRouteMaxExperts
  const float* y = nullptr;             // (hidden,) the o projection's output, before the norm
  const void* norm_w = nullptr;         // (hidden,)
  FloatType norm_type = FloatType::kF32;
  float eps = 0.0f;
  bool topk_softmax = false, renormalize = false;
  int32_t* indices = nullptr;  // (k) out
  float* weights = nullptr;    // (k) out
};
constexpr int kRouteMaxExperts = 64;  // four ranking threads per expert in a 256-thread block

struct FusedMoeArgs {
  WeightView gate, up, down;         // (n_experts, ffn, hidden), (n_experts, ffn, hidden), (n_experts, hidden, ffn)
  const float* x = nullptr;          // (hidden,)
  const int32_t* indices = nullptr;  // (k,) on the device
  const float* weights = nullptr;    // (k,)
  float* act = nullptr;              // (k, ffn) intermediate
  // With the tensor-core kernels: act also as kernel B's staged operand, written by kernel A (fused_act_bytes
  // bytes; null: kernel B stages act itself).
  unsigned char* act_staged = nullptr;
  float* out = nullptr;             // (hidden,)
  const float* residual = nullptr;  // when set: out = residual + the MoE output (residual may be out)
  int k = 0;
  GluAct glu = GluAct::kSiLU;
  // Output rows per warp of kernels A (1, 2 or 4) and B (1 or 2): launch-width knobs; results do not depend on them.
  int rows_per_warp = 2;
  int down_rows_per_warp = 1;  // kernel B: 1 or 2
  int max_slot_batch = 4;      // kernel B: most slots staged and loaded together (8, 4, 2 or 1)
  bool b_prefetch = true;      // kernel B loads its first weights before waiting for kernel A
  bool b_early = false;        // kernel B lets the next kernel launch as it starts (Ctx::pdl_early)
  bool bulk = true;            // kernels A and B fed by bulk copies where they apply (fused_moe_bulk.cu)
  // The bulk kernels on tensor cores (fused_moe_bulk_mma.cu): results within f32 rounding of the CUDA-core kernels,
  // no longer bit for bit those of the gather path. 0: never; 1: where measured faster (kernel B always, kernel A with
  // two rows per warp and more than 3 blocks per SM); 2: wherever they apply (tests).
  int mma = 1;
  // The tensor-core kernel A requests kernel B's down rows of its expert into L2 (its block's share, l2_rows rows of
  // l2_row_bytes packed and l2_srow scale bytes) once its up rows have landed. Off by default: the requests share DRAM
  // with the last blocks' up rows, which end kernel A (+0.25% without them on the H200, docs/benchmarks.md).
  bool l2_down = false;
  int l2_rows = 0, l2_row_bytes = 0, l2_srow = 0;
  // The tensor-core kernels load R consecutive groups of a tile at once, each row at its own offset (tile_groups_mma:
  // no bank conflicts); kernel A's warps then take consecutive groups (its sums in another order).
  bool rotate = true;
  // The tensor-core kernels multiply the raw codes by the vector as fixed point on int8 tensor cores (bulk_imma.cuh)
  // where that applies, instead of by three bf16 terms.
  bool imma = true;
  // The tensor-core kernels size their shared memory to the blocks per SM they are meant to run: kernel B asks for more
  // than half of an SM's where its grid fits on the SMs, so that its blocks spread one per SM (with room for two, the
  // scheduler packed two onto some SMs while others idled: OLMoE's int8 kernel B at 100 KB, 1,934 tok/s; at 116 KB or
  // more, 2,073), and kernel A for a quarter, so that its four blocks leave no room for another kernel's (49 KB: 2,074;
  // 50.6 KB or more: 2,110), each one allocation unit off (B beside two A blocks: 2,115 -> 2,121); B then also takes
  // every SM (none runs a fourth q/k/v block). docs/benchmarks.md, thirtieth and thirty-first trees.
  bool smem_fill = true;
  // Set (route.words): x is route.y before its norm, and indices and weights are outputs (FusedRoute).
  FusedRoute route;
};

// Launches kernels A and B. Preconditions (checked): gate/up bits equal and in {4, 8}; down bits in {4, 6, 8};
// one group size (a multiple of 32) and scale type for all three; hidden and ffn multiples of 32; 16-byte
// aligned packed weights; 1 <= k <= kMaxTopK. An expert index outside [0, n_experts) raises kErrExpertIndex
// and makes the output NaN.
void launch_fused_moe(const Ctx& ctx, const FusedMoeArgs& a);

// Kernels A and B with FusedMoeArgs::route (the tensor-core kernels on the int8 operand, up to 16 selected of up to
// kRouteMaxExperts experts): launched and true, or false (nothing launched) where they do not apply. dry: only the
// answer.
bool launch_fused_moe_routed(const Ctx& ctx, const FusedMoeArgs& a, bool dry);

// Device bytes of FusedMoeArgs::act_staged for k slots of moe_intermediate_size ffn.
size_t fused_act_bytes(int64_t ffn, int k);

// Internal: the tensor-core kernels A and B (fused_moe_mma.cu) for 4-/8-bit experts with group size 32, 64 or 128
// (decode_mma_applies). Each returns false, launching nothing, where it does not apply.
bool launch_fused_gate_up_mma(const Ctx& ctx, const FusedMoeArgs& a);
bool launch_fused_down_mma(const Ctx& ctx, const FusedMoeArgs& a);
// Internal: kernels A and B fed by bulk copies (fused_moe_bulk.cu, fused_moe_bulk_mma.cu) for 4-/8-bit experts with
// 16-byte aligned scales and biases (bulk_rows_ok), up to 16 selected experts, where their shared memory fits. Same
// contract as above.
bool launch_fused_gate_up_bulk(const Ctx& ctx, const FusedMoeArgs& a);
bool launch_fused_down_bulk(const Ctx& ctx, const FusedMoeArgs& a);

}  // namespace moecel::cuda
