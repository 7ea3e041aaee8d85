// Tensor helpers: shapes as text, host allocation, reshaped and sliced views.
#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace moecel {

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  if (s.size() == 1) out += ",";
  return out + ")";
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tensor Tensor::reshaped(Shape s) const {
  MOECEL_CHECK(shape_numel(s) == numel(), "cannot reshape {} to {}", shape_str(shape), shape_str(s));
  Tensor t = *this;
  t.shape = std::move(s);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  MOECEL_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape[0], "bad row slice [{}, {}) of {}", begin, end,
               shape_str(shape));
  Tensor t = *this;
  size_t row_bytes = numel() == 0 ? 0 : nbytes() / size_t(shape[0]);
  t.data = static_cast<char*>(data) + size_t(begin) * row_bytes;
  t.shape[0] = end - begin;
  return t;
}

Tensor make_host_tensor(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  MOECEL_CHECK(t.numel() >= 0, "negative tensor size {}", shape_str(t.shape));
  size_t bytes = (t.nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  if (!p) fail("out of memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes == 0 ? 64 : bytes);
  t.data = p;
  t.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

}  // namespace moecel
