// Tensor: a typed, shaped view of memory on one device, optionally keeping its storage alive.
// Weights are views into mmap'd checkpoint files (CPU) or device copies; activations are owned buffers.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moecel {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "(64, 1024, 32)"
int64_t shape_numel(const Shape& s);

struct Tensor {
  DType dtype = DType::kF32;
  Shape shape;
  void* data = nullptr;
  Device device = Device::kCpu;
  std::shared_ptr<void> owner;  // keeps the storage alive; null for borrowed views

  int ndim() const { return int(shape.size()); }
  int64_t numel() const { return shape_numel(shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t dim(int i) const { return shape.at(size_t(i < 0 ? i + ndim() : i)); }
  bool defined() const { return data != nullptr || numel() == 0; }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // View of the same storage with another shape of equal numel.
  Tensor reshaped(Shape s) const;
  // View of rows [begin, end) along the outermost axis.
  Tensor slice_rows(int64_t begin, int64_t end) const;
};

// Owned, zero-initialized, 64-byte aligned host tensor.
Tensor make_host_tensor(DType dtype, Shape shape);

}  // namespace moecel
