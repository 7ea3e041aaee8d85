// Writes random checkpoints from an architecture's test-model recipe: the exact mlx-community layout when
// quantized (stacked experts, U32 weights, scales/biases, quantization block), HF layout when dense
// (one tensor per expert). Used by `moecel make-test-model`, tests and benchmarks.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "quant/qweight.h"

namespace moecel {

struct TestModelOptions {
  std::string arch = "olmoe";
  std::string preset = "tiny";
  int bits = 4;  // 0 = unquantized
  int group_size = 64;
  DType dtype = DType::kBF16;  // dense weights, norms, scales and biases
  uint64_t seed = 0;
  // (module path suffix, spec): modules whose path ends with the suffix get this quantization instead.
  std::vector<std::pair<std::string, QuantSpec>> overrides;
  nlohmann::json config_overrides = nlohmann::json::object();
};

// Creates out_dir (if needed) and writes config.json and model.safetensors. Returns the bytes written.
size_t write_test_model(const TestModelOptions& opt, const std::string& out_dir);

}  // namespace moecel
