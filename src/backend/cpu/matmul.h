// Fast CPU matrix products for dense (F32/F16/BF16) and MLX affine-quantized weights: the linear and
// gather (MLX gather_qmm) paths of the CPU backend. f32 activations, f32 accumulation. AVX2/AVX-512 kernels
// are chosen at run time; a portable scalar path covers every format and machines without them.
// Used by: cpu_backend (linear, gather_linear), and anything else that needs y = x @ w^T on the CPU.
#pragma once
#include <cstdint>

#include "quant/qweight.h"

namespace moecel::cpu {

// y (n_tokens, w.out) = x (n_tokens, w.in) @ w[expert]^T; expert = 0 for 2-D weights.
// x rows are x_stride floats apart, y rows y_stride floats apart; y must not overlap x.
void linear(const LinearWeight& w, int64_t expert, const float* x, int64_t n_tokens, int64_t x_stride, float* y,
            int64_t y_stride);

// The gather path (MLX gather_qmm). w (n_experts, out, in); indices (n_tokens, k) in [0, n_experts).
// y (n_tokens, k, out): y[(t*k + j) * out + r] = dot(w[indices[t*k + j]][r], x_row) with
// x_row = x + t * in (x_per_slot = false: x is (n_tokens, in)) or x + (t*k + j) * in (x_per_slot = true:
// x is (n_tokens, k, in)). Pairs are grouped by expert so each expert's weights are decoded once; y must not
// overlap x. Throws moecel::Error for an index outside [0, n_experts) or a weight without an experts axis.
void gather_linear(const LinearWeight& w, const float* x, bool x_per_slot, const int32_t* indices, int64_t n_tokens,
                   int64_t k, float* y);

// Instruction-set levels of the kernels.
// kAvx512Vnni adds, for 4-, 6- and 8-bit weights, kernels that take x in per-group fixed point (22 or 20 bits)
// on VNNI's 8-bit dot products: within f32 rounding of the others, not bit for bit.
enum class SimdLevel { kScalar, kAvx2, kAvx512, kAvx512Vnni };

// The level in use: the best the CPU supports, capped at startup by MOECEL_CPU_SIMD (0/off/scalar, avx2, avx512,
// avx512vnni/best; anything else is an error) and afterwards by set_simd_level. For a given level, results are bitwise
// deterministic and do not depend on the thread count.
SimdLevel simd_level();
// Caps the level (for tests and benchmarks); a level the CPU lacks falls back to the best one it has.
void set_simd_level(SimdLevel level);
// Shorthand: false = portable scalar kernels only; true = the best the CPU supports.
void set_simd_enabled(bool enabled);
const char* simd_level_name(SimdLevel level);

}  // namespace moecel::cpu
