// config.json of a model folder: typed access by HF field name with errors that name the field, the
// rope settings in either form, and the MLX quantization block with per-module overrides.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "quant/qweight.h"

namespace moecel {

class ModelConfig {
 public:
  static ModelConfig load(const std::string& dir);  // reads DIR/config.json
  static ModelConfig from_json(const nlohmann::json& j, std::string source = "config.json");

  const nlohmann::json& json() const { return j_; }
  const std::string& source() const { return source_; }
  std::string model_type() const;  // required string field "model_type"

  bool has(const std::string& key) const;
  // Required fields: throw "config.json: field 'hidden_size' ..." when missing, of the wrong type, or out of
  // [lo, hi].
  int64_t get_int(const std::string& key, int64_t lo = 1, int64_t hi = int64_t(1) << 40) const;
  double get_float(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  // Optional fields: the default when missing or null; still an error when present with the wrong type.
  int64_t get_int_or(const std::string& key, int64_t def, int64_t lo = 0, int64_t hi = int64_t(1) << 40) const;
  double get_float_or(const std::string& key, double def) const;
  bool get_bool_or(const std::string& key, bool def) const;

  // rope theta: top-level "rope_theta", else rope_parameters.rope_theta, else `def`.
  double rope_theta(double def = 10000.0) const;
  // rope type: rope_parameters.rope_type, else rope_scaling.rope_type / .type, else "default".
  std::string rope_type() const;

  // The quantization block ("quantization" or "quantization_config"); nullopt when the model is not quantized.
  bool quantized() const { return default_quant_.has_value(); }
  std::optional<QuantSpec> default_quant() const { return default_quant_; }
  // The spec for a module path ("model.layers.0.mlp.gate"): its override when present, else the default.
  // nullopt when the model is unquantized or the override is `false` (module left dense).
  std::optional<QuantSpec> quant_for(const std::string& module_path) const;

 private:
  nlohmann::json j_;
  std::string source_;
  std::optional<QuantSpec> default_quant_;
};

}  // namespace moecel
