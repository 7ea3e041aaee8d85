// The CPU fused decode-MoE path (see fused_moe.h). Pass 1: pieces of (slot, ffn row) pairs compute the gate
// and up rows of the selected experts and write act(gate) * up in f32. Pass 2: pieces of (slot, hidden row)
// pairs run the down products, then each row sums them, weighted, in slot order. Rows use the same
// matrix-vector kernels as the gather path, so each dot product is bit-for-bit the gather path's.
#include "backend/cpu/fused_moe.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/vec.h"
#include "backend/op_checks.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace moecel::cpu {
namespace {

using detail::Kernels;
using detail::Slice;

// Rows per piece (detail::run_parts): 32 rows of a 2048-wide 4-bit weight are 36 KB, enough to make taking a
// piece cost nothing next to it.
constexpr int64_t kRows = 32;

}  // namespace

void fused_moe_decode(const LinearWeight& gate, const LinearWeight& up, const LinearWeight& down, Activation act,
                      const float* x, const int32_t* indices, const float* weights, int64_t k, float* out) {
  check_linear_weight(gate, "fused_moe", Device::kCpu);
  check_linear_weight(up, "fused_moe", Device::kCpu);
  check_linear_weight(down, "fused_moe", Device::kCpu);
  const int64_t n_experts = gate.n_stack, ffn = gate.out, hidden = gate.in;
  MOECEL_CHECK(n_experts > 0 && up.n_stack == n_experts && down.n_stack == n_experts && up.out == ffn &&
                   up.in == hidden && down.out == hidden && down.in == ffn,
               "fused_moe: expert weights {}, {}, {} do not form (n_experts, ffn, hidden) / (n_experts, hidden, ffn)",
               gate.name, up.name, down.name);
  MOECEL_CHECK(gate.bits == up.bits && gate.group_size == up.group_size,
               "fused_moe: {} and {} must share bits and group size", gate.name, up.name);
  for (int64_t j = 0; j < k; ++j) {
    MOECEL_CHECK(indices[j] >= 0 && indices[j] < n_experts, "fused_moe: expert index {} (slot {}) out of range [0, {})",
                 indices[j], j, n_experts);
  }
  if (k == 0 || hidden == 0) {
    std::fill(out, out + hidden, 0.0f);
    return;
  }

  // Pass 1: act (k, ffn) = act(gate[e_j] @ x) * (up[e_j] @ x). gate and up share a format, so one prepared x.
  const Slice g0 = detail::make_slice(gate, 0);
  const Kernels kg = detail::select_kernels(g0);
  std::vector<float> px(size_t(detail::prep_floats(g0)));
  kg.prep(g0, x, px.data());
  std::vector<float> act_buf(size_t(k * ffn)), up_buf(size_t(k * ffn));
  // Items are (slot, ffn row) pairs, slot-major: a thread's part walks each expert's rows in order.
  detail::run_parts(k * ffn, kRows, [&](int64_t b, int64_t e) {
    while (b < e) {  // a piece may span the end of one slot's rows and the start of the next
      const int64_t j = b / ffn, r0 = b % ffn, r1 = std::min(ffn, r0 + (e - b));
      float* a = act_buf.data() + j * ffn;
      float* u = up_buf.data() + j * ffn;
      kg.gemv(detail::make_slice(gate, indices[j]), px.data(), r0, r1, a);
      kg.gemv(detail::make_slice(up, indices[j]), px.data(), r0, r1, u);
      for (int64_t r = r0; r < r1; ++r) a[r] = glu_activation(act, a[r]) * u[r];
      b += r1 - r0;
    }
  });

  // Pass 2: out[r] = sum_j weights[j] * (down[e_j] @ act[j])[r], slots in order, one write per row.
  const Slice d0 = detail::make_slice(down, 0);
  const Kernels kd = detail::select_kernels(d0);
  const int64_t pf = detail::prep_floats(d0);
  std::vector<float> pact(size_t(k * pf));
  for (int64_t j = 0; j < k; ++j) kd.prep(d0, act_buf.data() + j * ffn, pact.data() + j * pf);
  std::vector<float> y_buf(size_t(k * hidden));  // (k, hidden) down products
  // Items are (slot, hidden row) pairs, slot-major, as in pass 1.
  detail::run_parts(k * hidden, kRows, [&](int64_t b, int64_t e) {
    while (b < e) {
      const int64_t j = b / hidden, r0 = b % hidden, r1 = std::min(hidden, r0 + (e - b));
      kd.gemv(detail::make_slice(down, indices[j]), pact.data() + j * pf, r0, r1, y_buf.data() + j * hidden);
      b += r1 - r0;
    }
  });
  // The gather path's weighted sum, slots in order.
  parallel_for(hidden, 256, [&](int64_t r0, int64_t r1) {
    std::fill(out + r0, out + r1, 0.0f);
    for (int64_t j = 0; j < k; ++j) axpy(weights[j], y_buf.data() + j * hidden + r0, out + r0, r1 - r0);
  });
}

}  // namespace moecel::cpu
