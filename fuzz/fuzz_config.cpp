// Fuzzes config.json handling: strict JSON parsing, ModelConfig (typed field access, rope settings, the MLX
// quantization block with per-module overrides), and then a full load_model of a fixed tiny quantized
// checkpoint with the fuzzed config.json, so the architecture's own config checks and the binding of weights
// against config-derived shapes and quantization specs run too.
#include <cstdint>
#include <string>

#include "backend/backend.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "io/config.h"
#include "io/json_parse.h"
#include "models/registry.h"
#include "models/test_model.h"

using namespace moecel;

namespace {

volatile uint64_t g_sink;

// A 1-layer olmoe checkpoint (4-bit, group 64, the router at 8 bits through an override).
const std::string& model_dir() {
  static const std::string dir = [] {
    const std::string d = fuzz::scratch_dir() + "/model";
    TestModelOptions opt;
    opt.overrides = {{"mlp.gate", QuantSpec{8, 64}}};
    opt.config_overrides = {{"vocab_size", 64},         {"hidden_size", 64},
                            {"intermediate_size", 64},  {"num_hidden_layers", 1},
                            {"num_attention_heads", 2}, {"num_key_value_heads", 2},
                            {"num_experts", 4},         {"num_experts_per_tok", 2},
                            {"eos_token_id", 63},       {"max_position_embeddings", 64}};
    write_test_model(opt, d);
    return d;
  }();
  return dir;
}

Backend& backend() {
  static std::unique_ptr<Backend> be = make_backend("cpu");
  return *be;
}

template <class F>
void guarded(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

void query(const ModelConfig& c) {
  for (const auto& item : c.json().items()) {
    const std::string key = item.key();  // (clang 14 cannot capture structured bindings)
    guarded([&] { g_sink = g_sink + uint64_t(c.get_int(key)); });
    guarded([&] { g_sink = g_sink + uint64_t(c.get_int_or(key, 7, -5, 1000)); });
    guarded([&] { g_sink = g_sink + uint64_t(c.get_float(key) > 0); });  // (a cast of any double would be UB)
    guarded([&] { g_sink = g_sink + uint64_t(c.get_float_or(key, 1.0) != 0); });
    guarded([&] { g_sink = g_sink + c.get_bool(key); });
    guarded([&] { g_sink = g_sink + c.get_bool_or(key, false); });
    guarded([&] { g_sink = g_sink + c.get_string(key).size(); });
    guarded([&] {
      auto q = c.quant_for(key);
      g_sink = g_sink + (q ? uint64_t(q->bits) : 0);
    });
  }
  guarded([&] { g_sink = g_sink + c.model_type().size(); });
  guarded([&] { g_sink = g_sink + uint64_t(c.rope_theta() > 1); });
  guarded([&] { g_sink = g_sink + c.rope_type().size(); });
  for (const char* m : {"model.layers.0.mlp.gate", "model.embed_tokens", "lm_head"}) {
    guarded([&] {
      auto q = c.quant_for(m);
      g_sink = g_sink + (q ? uint64_t(q->group_size) : 0);
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string& dir = model_dir();
  try {
    ModelConfig c = ModelConfig::from_json(parse_json_strict(text, "config.json"));
    query(c);
  } catch (const Error&) {
    return 0;  // the loader would reject it the same way
  }
  fuzz::write_file(dir + "/config.json", text);
  try {
    std::unique_ptr<Model> m = load_model(dir, backend());
    g_sink = g_sink + m->info().weight_bytes + m->info().eos_token_ids.size();
  } catch (const Error&) {
  }
  return 0;
}
