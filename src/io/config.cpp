// config.json access by HF field name. Every error names the source file and the field, and says what was
// expected. The MLX quantization block ("quantization", mirrored as "quantization_config") holds the default
// {group_size, bits, mode} plus per-module overrides keyed by module path: {group_size, bits} or false.
#include "io/config.h"

#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/json_parse.h"

namespace moecel {
namespace {

// Member functions below spell nlohmann::json in full: ModelConfig::json() hides the alias there.
using nlohmann::json;

std::string brief(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

// Integers may be written as integral floats (4096.0) by some exporters; anything else is not an integer.
std::optional<int64_t> as_int(const json& v) {
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return int64_t(u);
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return int64_t(d);
  }
  return std::nullopt;
}

int64_t checked_int(const std::string& src, const std::string& field, const json& v, int64_t lo, int64_t hi) {
  std::optional<int64_t> i = as_int(v);
  if (!i || *i < lo || *i > hi) {
    fail("{}: field '{}' must be an integer in [{}, {}], got {}", src, field, lo, hi, brief(v));
  }
  return *i;
}

double checked_float(const std::string& src, const std::string& field, const json& v) {
  if (!v.is_number()) fail("{}: field '{}' must be a number, got {}", src, field, brief(v));
  return v.get<double>();
}

// The quantization block in use: "quantization" (mlx-lm) first, else "quantization_config".
const json* quant_block(const json& j, std::string* key) {
  for (const char* k : {"quantization", "quantization_config"}) {
    auto it = j.find(k);
    if (it != j.end() && !it->is_null()) {
      *key = k;
      return &*it;
    }
  }
  return nullptr;
}

void check_mode(const std::string& src, const std::string& field, const json& obj) {
  auto it = obj.find("mode");
  if (it == obj.end() || it->is_null()) return;  // mlx-lm's default mode is affine
  if (!it->is_string()) fail("{}: field '{}.mode' must be a string, got {}", src, field, brief(*it));
  if (it->get<std::string>() != "affine") {
    fail("{}: field '{}.mode' is '{}', but only 'affine' quantization is supported", src, field,
         it->get<std::string>());
  }
}

// Reads {group_size, bits, mode}; missing fields fall back to `def` (for overrides) or are errors.
QuantSpec parse_spec(const std::string& src, const std::string& field, const json& obj,
                     const std::optional<QuantSpec>& def) {
  QuantSpec s;
  auto gs = obj.find("group_size");
  if (gs != obj.end()) {
    s.group_size = int(checked_int(src, field + ".group_size", *gs, 1, 1 << 20));
  } else if (def) {
    s.group_size = def->group_size;
  } else {
    fail("{}: missing field '{}.group_size'", src, field);
  }
  if (!valid_group_size(s.group_size)) {
    fail("{}: field '{}.group_size' must be one of 32, 64, 128, got {}", src, field, s.group_size);
  }
  auto bits = obj.find("bits");
  if (bits != obj.end()) {
    s.bits = int(checked_int(src, field + ".bits", *bits, 1, 64));
  } else if (def) {
    s.bits = def->bits;
  } else {
    fail("{}: missing field '{}.bits'", src, field);
  }
  if (!valid_bits(s.bits)) fail("{}: field '{}.bits' must be one of 2, 3, 4, 5, 6, 8, got {}", src, field, s.bits);
  check_mode(src, field, obj);
  return s;
}

// An override value: {group_size?, bits?, mode?}, true (the default spec) or false (module left dense).
std::optional<QuantSpec> parse_override(const std::string& src, const std::string& block, const std::string& path,
                                        const json& v, const QuantSpec& def) {
  const std::string field = block + "." + path;
  if (v.is_boolean()) return v.get<bool>() ? std::optional<QuantSpec>(def) : std::nullopt;
  auto gscale = v.find("global_scale");
  if (gscale != v.end() && gscale->is_boolean() && gscale->get<bool>()) {
    fail("{}: field '{}.global_scale' is set, but only plain 'affine' quantization is supported", src, field);
  }
  return parse_spec(src, field, v, def);
}

bool is_override(const json& v) {
  return v.is_object() || v.is_boolean();
}

}  // namespace

ModelConfig ModelConfig::load(const std::string& dir) {
  const std::string path = dir + "/config.json";
  return from_json(parse_json_strict(read_text_file(path), path), path);
}

ModelConfig ModelConfig::from_json(const nlohmann::json& j, std::string source) {
  if (!j.is_object()) fail("{}: must be a JSON object, got {}", source, brief(j));
  ModelConfig c;
  c.j_ = j;
  c.source_ = std::move(source);
  std::string key;
  const nlohmann::json* q = quant_block(j, &key);
  if (q) {
    const std::string& src = c.source_;
    if (!q->is_object()) fail("{}: field '{}' must be an object, got {}", src, key, brief(*q));
    auto method = q->find("quant_method");
    if (method != q->end()) {
      // HF-style blocks (gptq, awq, fp8, bitsandbytes, ...) describe other formats.
      fail(
          "{}: field '{}.quant_method' is {}: only MLX affine quantization ('quantization': {{group_size, bits}}) "
          "is supported",
          src, key, brief(*method));
    }
    c.default_quant_ = parse_spec(src, key, *q, std::nullopt);
    // Validate every override now so a bad one fails at load, not when its module is bound.
    for (const auto& [path, v] : q->items()) {
      if (path == "group_size" || path == "bits" || path == "mode") continue;
      if (is_override(v)) parse_override(src, key, path, v, *c.default_quant_);
    }
    // mlx-lm writes both blocks; if the mirror disagrees on the defaults, the checkpoint is ambiguous.
    auto mirror = j.find("quantization_config");
    if (key == "quantization" && mirror != j.end() && mirror->is_object() && !mirror->contains("quant_method") &&
        mirror->contains("bits") && mirror->contains("group_size")) {
      QuantSpec m = parse_spec(src, "quantization_config", *mirror, std::nullopt);
      if (m.bits != c.default_quant_->bits || m.group_size != c.default_quant_->group_size) {
        fail("{}: 'quantization' (bits {}, group_size {}) and 'quantization_config' (bits {}, group_size {}) disagree",
             src, c.default_quant_->bits, c.default_quant_->group_size, m.bits, m.group_size);
      }
    }
  }
  return c;
}

std::string ModelConfig::model_type() const {
  return get_string("model_type");
}

bool ModelConfig::has(const std::string& key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

int64_t ModelConfig::get_int(const std::string& key, int64_t lo, int64_t hi) const {
  if (!has(key)) fail("{}: missing required field '{}' (an integer in [{}, {}])", source_, key, lo, hi);
  return checked_int(source_, key, j_.at(key), lo, hi);
}

double ModelConfig::get_float(const std::string& key) const {
  if (!has(key)) fail("{}: missing required field '{}' (a number)", source_, key);
  return checked_float(source_, key, j_.at(key));
}

bool ModelConfig::get_bool(const std::string& key) const {
  if (!has(key)) fail("{}: missing required field '{}' (true or false)", source_, key);
  const nlohmann::json& v = j_.at(key);
  if (!v.is_boolean()) fail("{}: field '{}' must be true or false, got {}", source_, key, brief(v));
  return v.get<bool>();
}

std::string ModelConfig::get_string(const std::string& key) const {
  if (!has(key)) fail("{}: missing required field '{}' (a string)", source_, key);
  const nlohmann::json& v = j_.at(key);
  if (!v.is_string()) fail("{}: field '{}' must be a string, got {}", source_, key, brief(v));
  return v.get<std::string>();
}

int64_t ModelConfig::get_int_or(const std::string& key, int64_t def, int64_t lo, int64_t hi) const {
  return has(key) ? checked_int(source_, key, j_.at(key), lo, hi) : def;
}

double ModelConfig::get_float_or(const std::string& key, double def) const {
  return has(key) ? checked_float(source_, key, j_.at(key)) : def;
}

bool ModelConfig::get_bool_or(const std::string& key, bool def) const {
  return has(key) ? get_bool(key) : def;
}

double ModelConfig::rope_theta(double def) const {
  double theta = def;
  std::string field = "rope_theta";
  if (has("rope_theta")) {
    theta = checked_float(source_, field, j_.at("rope_theta"));
  } else if (has("rope_parameters")) {
    const nlohmann::json& rp = j_.at("rope_parameters");
    if (!rp.is_object()) fail("{}: field 'rope_parameters' must be an object, got {}", source_, brief(rp));
    field = "rope_parameters.rope_theta";
    if (rp.contains("rope_theta") && !rp.at("rope_theta").is_null()) {
      theta = checked_float(source_, field, rp.at("rope_theta"));
    }
  }
  if (!(theta > 0) || !std::isfinite(theta))
    fail("{}: field '{}' must be a positive number, got {}", source_, field, theta);
  return theta;
}

std::string ModelConfig::rope_type() const {
  // transformers >= 5 keeps it in rope_parameters; older configs in rope_scaling ("rope_type" or legacy "type").
  for (const char* block : {"rope_parameters", "rope_scaling"}) {
    if (!has(block)) continue;
    const nlohmann::json& rp = j_.at(block);
    if (!rp.is_object()) fail("{}: field '{}' must be an object, got {}", source_, block, brief(rp));
    for (const char* k : {"rope_type", "type"}) {
      auto it = rp.find(k);
      if (it == rp.end() || it->is_null()) continue;
      if (!it->is_string()) fail("{}: field '{}.{}' must be a string, got {}", source_, block, k, brief(*it));
      return it->get<std::string>();
    }
  }
  return "default";
}

std::optional<QuantSpec> ModelConfig::quant_for(const std::string& module_path) const {
  if (!default_quant_) return std::nullopt;
  std::string key;
  const nlohmann::json* q = quant_block(j_, &key);
  auto it = q->find(module_path);
  if (it != q->end() && is_override(*it)) return parse_override(source_, key, module_path, *it, *default_quant_);
  return default_quant_;
}

}  // namespace moecel
