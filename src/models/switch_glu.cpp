// SwitchGLU paths. The gather path mirrors MLX's SwitchGLU: gather_qmm for gate and up, the activation,
// gather_qmm for down, then the routing-weighted sum.
#include "models/switch_glu.h"

namespace moecel {

size_t SwitchGLU::bytes_per_expert() const {
  return w_.gate.bytes_per_slice() + w_.up.bytes_per_slice() + w_.down.bytes_per_slice();
}

// Every output below is fully written by its op, hence scratch (no memset).
Tensor SwitchGLU::forward(Backend& be, const Tensor& x, const Tensor& indices, const Tensor& weights) const {
  const int64_t n = indices.dim(0), k = indices.dim(1);
  const int64_t ffn = ffn_size(), hidden = hidden_size();
  Tensor gate = be.scratch(DType::kF32, {n, k, ffn});
  Tensor up = be.scratch(DType::kF32, {n, k, ffn});
  be.gather_linear(w_.gate, x, indices, gate);
  be.gather_linear(w_.up, x, indices, up);
  be.glu(act_, gate, up, gate);  // (n_tokens, k, ffn)
  Tensor y = be.scratch(DType::kF32, {n, k, hidden});
  be.gather_linear(w_.down, gate, indices, y);
  Tensor out = be.scratch(DType::kF32, {n, hidden});
  be.moe_weighted_sum(y, weights, out);
  return out;
}

}  // namespace moecel
