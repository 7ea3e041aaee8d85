// Input checks shared by the backends (op_checks.h).
#include "backend/op_checks.h"

#include <string>

#include "core/error.h"

namespace moecel {

void check_f32_dtype(const Tensor& t, const char* what) {
  MOECEL_CHECK(t.dtype == DType::kF32, "{}: expected an F32 tensor, got {}", what, dtype_name(t.dtype));
}

void check_rows(const Tensor& t, int64_t rows, int64_t cols, const char* what) {
  MOECEL_CHECK(t.numel() == rows * cols, "{}: expected {} elements ({} x {}), got shape {}", what, rows * cols, rows,
               cols, shape_str(t.shape));
}

void check_linear_weight(const LinearWeight& w, const char* op, Device dev) {
  const std::string& n = w.name;
  // Where a tensor must live, in the words each backend's users need.
  const char* misplaced =
      dev == Device::kCuda ? "is in host memory; upload it with to_device" : "is not in host memory";
  MOECEL_CHECK(w.weight.device == dev, "{}: weight {} {}", op, n, misplaced);
  MOECEL_CHECK(w.out >= 0 && w.in > 0, "{}: weight {} has bad shape out={} in={}", op, n, w.out, w.in);
  MOECEL_CHECK(w.n_stack >= 0, "{}: weight {} has n_stack {}", op, n, w.n_stack);
  const Shape lead = w.n_stack > 0 ? Shape{w.n_stack} : Shape{};
  auto expect = [&](const Tensor& t, const char* what, int64_t cols) {
    Shape want = lead;
    want.push_back(w.out);
    want.push_back(cols);
    MOECEL_CHECK(t.shape == want, "{}: {}.{}: expected shape {}, got {}", op, n, what, shape_str(want),
                 shape_str(t.shape));
    MOECEL_CHECK(t.numel() == 0 || t.data != nullptr, "{}: {}.{} has no data", op, n, what);
    MOECEL_CHECK(t.device == dev, "{}: {}.{} {}", op, n, what, misplaced);
  };
  if (!w.quantized()) {
    MOECEL_CHECK(is_float(w.weight.dtype), "{}: dense weight {} must be F32/F16/BF16, got {}", op, n,
                 dtype_name(w.weight.dtype));
    expect(w.weight, "weight", w.in);
    return;
  }
  MOECEL_CHECK(valid_bits(w.bits) && valid_group_size(w.group_size),
               "{}: weight {}: unsupported quantization bits={} group_size={}", op, n, w.bits, w.group_size);
  MOECEL_CHECK(w.in % w.group_size == 0 && (w.in * w.bits) % 32 == 0,
               "{}: weight {}: in={} is not a multiple of group_size {} and 32/bits", op, n, w.in, w.group_size);
  MOECEL_CHECK(w.weight.dtype == DType::kU32, "{}: {}.weight must be U32 packed, got {}", op, n,
               dtype_name(w.weight.dtype));
  expect(w.weight, "weight", w.in * w.bits / 32);
  MOECEL_CHECK(is_float(w.scales.dtype), "{}: {}.scales must be F32/F16/BF16, got {}", op, n,
               dtype_name(w.scales.dtype));
  expect(w.scales, "scales", w.in / w.group_size);
  if (w.biases.data != nullptr) {
    MOECEL_CHECK(w.biases.dtype == w.scales.dtype, "{}: {}.biases dtype {} differs from scales dtype {}", op, n,
                 dtype_name(w.biases.dtype), dtype_name(w.scales.dtype));
    expect(w.biases, "biases", w.in / w.group_size);
  }
}

int64_t check_sigmoid_gated(const Tensor& a, const Tensor& gate, const Tensor& b, const Tensor& out) {
  check_f32_dtype(a, "add_sigmoid_gated input");
  check_f32_dtype(gate, "add_sigmoid_gated gate");
  check_f32_dtype(b, "add_sigmoid_gated input");
  check_f32_dtype(out, "add_sigmoid_gated output");
  const int64_t n = gate.numel();
  MOECEL_CHECK(n > 0 && a.numel() == b.numel() && a.numel() == out.numel() && a.numel() % n == 0,
               "add_sigmoid_gated: shapes {}, {} and {} with gate {} (one gate per row) do not match",
               shape_str(a.shape), shape_str(b.shape), shape_str(out.shape), shape_str(gate.shape));
  return n;
}

}  // namespace moecel
