// Float32 .npy files (NumPy format 1.0/2.0/3.0): golden reference data written by tools/reference/ scripts
// and compared in tests, and debugging dumps of activations.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moecel {

struct NpyArray {
  Shape shape;  // C order; () for a scalar
  std::vector<float> data;
};

// Writes `data` (shape_numel(shape) floats, C order) as '<f4'. Throws moecel::Error on I/O failure.
void write_npy(const std::string& path, const Shape& shape, const float* data);
void write_npy(const std::string& path, const NpyArray& a);  // checks data.size() against the shape

// Reads a '<f4', C-order .npy file, validating magic, version, header dict, shape and file size.
NpyArray read_npy(const std::string& path);

}  // namespace moecel
