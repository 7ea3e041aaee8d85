// The CPU fused decode-MoE path (see fused_moe.h). Pass 1: tasks over (slot, block of ffn rows) compute the
// gate and up rows of the selected experts and write act(gate) * up in f32. Pass 2: tasks over blocks of hidden
// rows run the k down products for their rows and sum them, weighted, in slot order. Rows use the same
// matrix-vector kernels as the gather path, so each dot product is bit-for-bit the gather path's.
#include "backend/cpu/fused_moe.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/vec.h"
#include "backend/op_checks.h"
#include "core/error.h"

namespace moecel::cpu {
namespace {

using detail::Kernels;
using detail::Slice;

// Rows per task: 64 rows of a 2048-wide 4-bit weight are 72 KB, enough to make a task's overhead negligible.
constexpr int64_t kRows = 64;

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
  const int64_t ffn_blocks = (ffn + kRows - 1) / kRows;
  detail::run_tasks(k * ffn_blocks, [&](int64_t task) {
    const int64_t j = task / ffn_blocks, r0 = (task % ffn_blocks) * kRows, r1 = std::min(ffn, r0 + kRows);
    float* a = act_buf.data() + j * ffn;
    float* u = up_buf.data() + j * ffn;
    kg.gemv(detail::make_slice(gate, indices[j]), px.data(), r0, r1, a);
    kg.gemv(detail::make_slice(up, indices[j]), px.data(), r0, r1, u);
    for (int64_t r = r0; r < r1; ++r) a[r] = glu_activation(act, a[r]) * u[r];
  });

  // Pass 2: out[r] = sum_j weights[j] * (down[e_j] @ act[j])[r], slots in order, one write per row.
  const Slice d0 = detail::make_slice(down, 0);
  const Kernels kd = detail::select_kernels(d0);
  const int64_t pf = detail::prep_floats(d0);
  std::vector<float> pact(size_t(k * pf));
  for (int64_t j = 0; j < k; ++j) kd.prep(d0, act_buf.data() + j * ffn, pact.data() + j * pf);
  std::vector<float> y_buf(size_t(k * hidden));  // (k, hidden) down products, each row written by one task
  const int64_t hidden_blocks = (hidden + kRows - 1) / kRows;
  detail::run_tasks(hidden_blocks, [&](int64_t task) {
    const int64_t r0 = task * kRows, r1 = std::min(hidden, r0 + kRows);
    std::fill(out + r0, out + r1, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      float* y = y_buf.data() + j * hidden;
      kd.gemv(detail::make_slice(down, indices[j]), pact.data() + j * pf, r0, r1, y);
      axpy(weights[j], y + r0, out + r0, r1 - r0);  // the gather path's weighted sum, same order
    }
  });
}

}  // namespace moecel::cpu
