// Names of element types, as safetensors spells them.
#include "core/dtype.h"

namespace moecel {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kU32: return "U32";
    case DType::kI32: return "I32";
    case DType::kU8: return "U8";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kU32, DType::kI32, DType::kU8}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

}  // namespace moecel
