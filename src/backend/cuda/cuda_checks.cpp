// Host-side checks of CudaBackend's ops (cuda_backend_impl.h) that only a device backend needs (device residency,
// alignment, overlap, float types for the kernels); the checks both backends share are in backend/op_checks.h.
// (src/backend/**/*.cpp is globbed into moecel_lib even without CUDA, hence the guard.)
#if defined(MOECEL_HAVE_CUDA)
#include <cstdlib>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/op_checks.h"

namespace moecel::cuda_host {

using cuda::FloatType;

FloatType float_type(DType t, const std::string& what) {
  switch (t) {
    case DType::kF32: return FloatType::kF32;
    case DType::kF16: return FloatType::kF16;
    case DType::kBF16: return FloatType::kBF16;
    default: fail("{}: expected an F32, F16 or BF16 tensor, got {}", what, dtype_name(t));
  }
}

void check_dev(const Tensor& t, const char* what) {
  MOECEL_CHECK(t.device == Device::kCuda,
               "{}: tensor {} is in host memory; the CUDA backend needs it on the device "
               "(alloc / to_device)",
               what, shape_str(t.shape));
  MOECEL_CHECK(t.data != nullptr || t.numel() == 0, "{}: tensor {} has no data", what, shape_str(t.shape));
}

void check_f32(const Tensor& t, const char* what) {
  check_dev(t, what);
  check_f32_dtype(t, what);
}

void check_no_overlap(const Tensor& a, const Tensor& b, const char* what) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  const bool overlap = a.nbytes() > 0 && b.nbytes() > 0 && pa < pb + b.nbytes() && pb < pa + a.nbytes();
  MOECEL_CHECK(!overlap, "{}: the output must not overlap the input", what);
}

cuda::WeightView weight_view(const LinearWeight& w, const char* op) {
  check_linear_weight(w, op, Device::kCuda);
  const std::string& n = w.name;
  cuda::WeightView v;
  v.n_stack = std::max<int64_t>(1, w.n_stack);
  v.out = w.out;
  v.in = w.in;
  v.w = w.weight.data;
  if (!w.quantized()) {
    v.wtype = float_type(w.weight.dtype, fmt::format("{}: dense weight {}", op, n));
    return v;
  }
  MOECEL_CHECK(reinterpret_cast<uintptr_t>(w.weight.data) % 16 == 0,
               "{}: {}.weight is not 16-byte aligned on the device (upload it with to_device)", op, n);
  v.stype = float_type(w.scales.dtype, fmt::format("{}: {}.scales", op, n));
  v.scales = w.scales.data;
  v.biases = w.biases.data;  // null: zero biases
  v.bits = w.bits;
  v.group_size = w.group_size;
  return v;
}

int knob_from_env(const char* name, int fallback, std::initializer_list<int> allowed) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  std::string list;
  for (int a : allowed) {
    if (std::to_string(a) == v) return a;
    list += (list.empty() ? "" : ", ") + std::to_string(a);
  }
  fail("{}='{}': expected one of {}", name, v, list);
}

}  // namespace moecel::cuda_host
#endif  // MOECEL_HAVE_CUDA
