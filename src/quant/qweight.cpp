// Checked construction of LinearWeight: dtypes, ranks and shapes of weight / scales / biases, and the bits
// implied by the shapes cross-checked with the config (DESIGN.md section 3).
#include "quant/qweight.h"

#include "core/error.h"

namespace moecel {
namespace {

// The (bits, group_size) pairs that fit a packed width and group count, for error hints.
std::string shape_hint(int64_t packed_cols, int64_t n_groups) {
  std::string out;
  for (int gs : {32, 64, 128}) {
    const int64_t in = n_groups * gs;
    if (in <= 0 || (packed_cols * 32) % in != 0) continue;
    const int64_t bits = packed_cols * 32 / in;
    if (!valid_bits(int(bits))) continue;
    out += fmt::format("{}bits {}, group_size {}", out.empty() ? "" : " or ", bits, gs);
  }
  return out.empty() ? "no valid bits/group_size fits these shapes" : "the shapes fit " + out;
}

void check_rank(const std::string& tensor, const Tensor& t, bool stacked, const char* dims) {
  const int want = stacked ? 3 : 2;
  MOECEL_CHECK(t.ndim() == want, "tensor {}: expected {} dims {}, got {}", tensor, want, dims, shape_str(t.shape));
  for (int64_t d : t.shape)
    MOECEL_CHECK(d > 0, "tensor {}: every dim must be positive, got {}", tensor, shape_str(t.shape));
  MOECEL_CHECK(t.data != nullptr, "tensor {}: has no data", tensor);
}

}  // namespace

bool valid_bits(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
bool valid_group_size(int group_size) {
  return group_size == 32 || group_size == 64 || group_size == 128;
}

size_t LinearWeight::bytes_per_slice() const {
  if (!quantized()) return size_t(out) * size_t(in) * dtype_size(weight.dtype);
  const size_t packed = size_t(out) * size_t(in * bits / 32) * 4;
  const size_t params = 2 * size_t(out) * size_t(in / group_size) * dtype_size(scales.dtype);
  return packed + params;
}

size_t LinearWeight::total_bytes() const {
  return bytes_per_slice() * size_t(n_stack > 0 ? n_stack : 1);
}

LinearWeight LinearWeight::quantized_from(std::string name, Tensor weight, Tensor scales, Tensor biases,
                                          QuantSpec expected, bool stacked) {
  const std::string wn = name + ".weight", sn = name + ".scales", bn = name + ".biases";
  MOECEL_CHECK(valid_bits(expected.bits) && valid_group_size(expected.group_size),
               "{}: config quantization bits {} / group_size {} are not supported (bits 2, 3, 4, 5, 6, 8; group_size "
               "32, 64, 128)",
               name, expected.bits, expected.group_size);
  MOECEL_CHECK(weight.dtype == DType::kU32, "tensor {}: expected dtype U32 (packed quantized weight), got {}", wn,
               dtype_name(weight.dtype));
  MOECEL_CHECK(is_float(scales.dtype), "tensor {}: expected dtype F32, F16 or BF16, got {}", sn,
               dtype_name(scales.dtype));
  MOECEL_CHECK(biases.dtype == scales.dtype, "tensor {}: expected dtype {} (same as scales), got {}", bn,
               dtype_name(scales.dtype), dtype_name(biases.dtype));
  const char* wdims = stacked ? "(n_experts, out, in * bits / 32)" : "(out, in * bits / 32)";
  const char* sdims = stacked ? "(n_experts, out, in / group_size)" : "(out, in / group_size)";
  check_rank(wn, weight, stacked, wdims);
  check_rank(sn, scales, stacked, sdims);
  check_rank(bn, biases, stacked, sdims);

  const int64_t packed_cols = weight.dim(-1);
  const int64_t n_groups = scales.dim(-1);
  // Scales must match the weight's leading dims; their last dim fixes `in` given the config's group size.
  Shape want_s = weight.shape;
  want_s.back() = n_groups;
  MOECEL_CHECK(scales.shape == want_s, "tensor {}: expected {} (leading dims of {}), got {}", sn, shape_str(want_s), wn,
               shape_str(scales.shape));
  MOECEL_CHECK(biases.shape == scales.shape, "tensor {}: expected {} (same as scales), got {}", bn,
               shape_str(scales.shape), shape_str(biases.shape));

  const int64_t in = n_groups * expected.group_size;
  // Bits implied by the shapes: packed_cols * 32 == bits * in.
  if (packed_cols * 32 != int64_t(expected.bits) * in) {
    // What the scales would have to be for the config's bits, in the DESIGN.md message form, plus a hint.
    const bool exact =
        (packed_cols * 32) % expected.bits == 0 && (packed_cols * 32 / expected.bits) % expected.group_size == 0;
    Shape want = weight.shape;
    want.back() = exact ? packed_cols * 32 / expected.bits / expected.group_size : -1;
    if (exact) {
      fail("tensor {}: expected {}, got {} (config: bits {}, group_size {}; {})", sn, shape_str(want),
           shape_str(scales.shape), expected.bits, expected.group_size, shape_hint(packed_cols, n_groups));
    }
    fail("tensor {}: packed width {} does not fit bits {} with group_size {} and {} groups ({})", wn, packed_cols,
         expected.bits, expected.group_size, n_groups, shape_hint(packed_cols, n_groups));
  }

  LinearWeight w;
  w.name = std::move(name);
  w.bits = expected.bits;
  w.group_size = expected.group_size;
  w.n_stack = stacked ? weight.dim(0) : 0;
  w.out = weight.dim(-2);
  w.in = in;
  w.weight = std::move(weight);
  w.scales = std::move(scales);
  w.biases = std::move(biases);
  return w;
}

LinearWeight LinearWeight::dense_from(std::string name, Tensor weight, bool stacked) {
  const std::string wn = name + ".weight";
  MOECEL_CHECK(is_float(weight.dtype), "tensor {}: expected dtype F32, F16 or BF16 for a dense weight, got {}", wn,
               dtype_name(weight.dtype));
  check_rank(wn, weight, stacked, stacked ? "(n_experts, out, in)" : "(out, in)");
  LinearWeight w;
  w.name = std::move(name);
  w.n_stack = stacked ? weight.dim(0) : 0;
  w.out = weight.dim(-2);
  w.in = weight.dim(-1);
  w.weight = std::move(weight);
  return w;
}

}  // namespace moecel
