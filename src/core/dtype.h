// Element types of tensors as they appear in checkpoints (safetensors names) and in activations.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace moecel {

enum class DType : uint8_t { kF32, kF16, kBF16, kU32, kI32, kU8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kU32: return 4;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
  }
  return 0;
}

// safetensors spelling: "F32", "F16", "BF16", "U32", "I32", "U8".
std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);

inline bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

}  // namespace moecel
