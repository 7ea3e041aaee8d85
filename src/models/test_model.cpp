// Random checkpoint writer. Quantized weights are drawn directly as random codes with per-group scales and
// biases (no float weights are materialized), so the 3.9 GB real-shape preset is written in seconds.
#include "models/test_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "models/registry.h"
#include "quant/affine.h"

namespace moecel {
namespace {

// splitmix64: a tiny seeded generator; each tensor gets its own stream so output is independent of threading.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
};

uint64_t hash_name(const std::string& s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (char c : s) h = (h ^ uint8_t(c)) * 1099511628211ull;
  return h;
}

void store_float(void* data, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(data)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(data)[i] = f32_to_f16(v); break;
    case DType::kBF16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(v); break;
    default: fail("test model: {} is not a float dtype", dtype_name(dtype));
  }
}

// Fills a float tensor: uniform with the given std around `center`. Rows are generated in parallel, each from
// its own stream.
void fill_dense(Tensor& t, float center, float std, uint64_t seed) {
  const int64_t cols = t.shape.back(), rows = t.numel() / cols;
  const float half_width = std * std::sqrt(3.0f);
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      Rng rng{seed ^ (uint64_t(r) * 0x2545F4914F6CDD1Dull)};
      for (int64_t c = 0; c < cols; ++c) {
        store_float(t.data, t.dtype, r * cols + c, center + (2.0f * rng.uniform() - 1.0f) * half_width);
      }
    }
  });
}

// Random codes with per-group scale/bias chosen so values are centered with roughly the given std.
void fill_quantized(Tensor& w, Tensor& scales, Tensor& biases, int bits, float std, uint64_t seed) {
  const int64_t words = w.shape.back(), rows = w.numel() / words, groups = scales.shape.back();
  const float levels = float((1 << bits) - 1);
  const float code_std = std::sqrt((float(1 << bits) * float(1 << bits) - 1.0f) / 12.0f);
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      Rng rng{seed ^ (uint64_t(r) * 0x2545F4914F6CDD1Dull)};
      uint32_t* wp = w.ptr<uint32_t>() + r * words;
      for (int64_t i = 0; i < words; ++i) wp[i] = uint32_t(rng.next());
      for (int64_t g = 0; g < groups; ++g) {
        const float s = std / code_std * (0.5f + rng.uniform());
        store_float(scales.data, scales.dtype, r * groups + g, s);
        store_float(biases.data, biases.dtype, r * groups + g, -s * levels * 0.5f + (rng.uniform() - 0.5f) * s);
      }
    }
  });
}

std::optional<QuantSpec> spec_for(const TestModelOptions& opt, const std::string& module) {
  std::optional<QuantSpec> spec;
  if (opt.bits != 0) spec = QuantSpec{opt.bits, opt.group_size};
  for (const auto& [suffix, s] : opt.overrides) {
    if (module.ends_with(suffix)) spec = s;
  }
  return spec;
}

}  // namespace

size_t write_test_model(const TestModelOptions& opt, const std::string& out_dir) {
  MOECEL_CHECK(is_float(opt.dtype), "--dtype must be f32, f16 or bf16");
  if (opt.bits != 0) {
    MOECEL_CHECK(valid_bits(opt.bits), "--bits must be 0 (unquantized) or one of 2, 3, 4, 5, 6, 8; got {}", opt.bits);
    MOECEL_CHECK(valid_group_size(opt.group_size), "--group-size must be 32, 64 or 128; got {}", opt.group_size);
  }
  for (const auto& [suffix, s] : opt.overrides) {
    MOECEL_CHECK(valid_bits(s.bits) && valid_group_size(s.group_size), "override {}: bad bits {} / group size {}",
                 suffix, s.bits, s.group_size);
  }
  MOECEL_CHECK(opt.bits != 0 || opt.overrides.empty(), "--override needs a quantized model (--bits > 0)");
  const Architecture& arch = find_architecture(opt.arch);
  TestModelSpec spec = arch.test_model(opt.preset, opt.config_overrides);

  nlohmann::json quant = nlohmann::json::object();
  std::vector<std::pair<std::string, Tensor>> out;
  size_t bytes = 0;
  for (const TestTensor& t : spec.tensors) {
    const uint64_t seed = hash_name(t.name, opt.seed);
    if (!t.linear) {
      Tensor v = make_host_tensor(opt.dtype, t.shape);
      fill_dense(v, 1.0f, t.std, seed);
      out.emplace_back(t.name, v);
      continue;
    }
    std::optional<QuantSpec> q = spec_for(opt, t.name);
    const int64_t in = t.shape.back();
    if (q) {
      MOECEL_CHECK(in % q->group_size == 0 && (in * q->bits) % 32 == 0,
                   "{}: input width {} does not fit bits {} / group size {}", t.name, in, q->bits, q->group_size);
      Shape ws = t.shape, ss = t.shape;
      ws.back() = packed_words(in, q->bits);
      ss.back() = in / q->group_size;
      Tensor w = make_host_tensor(DType::kU32, ws), s = make_host_tensor(opt.dtype, ss),
             b = make_host_tensor(opt.dtype, ss);
      fill_quantized(w, s, b, q->bits, t.std, seed);
      out.emplace_back(t.name + ".weight", w);
      out.emplace_back(t.name + ".scales", s);
      out.emplace_back(t.name + ".biases", b);
      if (opt.bits == 0 || q->bits != opt.bits || q->group_size != opt.group_size) {
        quant[t.name] = {{"group_size", q->group_size}, {"bits", q->bits}};
      }
    } else if (t.shape.size() == 3 && t.name.find(".switch_mlp.") != std::string::npos) {
      // Dense experts go out in the HF layout: one tensor per expert.
      Tensor w = make_host_tensor(opt.dtype, t.shape);
      fill_dense(w, 0.0f, t.std, seed);
      const std::string base = t.name.substr(0, t.name.find(".switch_mlp.")) + ".experts.";
      const std::string proj = t.name.substr(t.name.find(".switch_mlp.") + 12);
      for (int64_t e = 0; e < t.shape[0]; ++e) {
        out.emplace_back(base + std::to_string(e) + "." + proj + ".weight",
                         w.slice_rows(e, e + 1).reshaped({t.shape[1], t.shape[2]}));
      }
    } else {
      Tensor w = make_host_tensor(opt.dtype, t.shape);
      fill_dense(w, 0.0f, t.std, seed);
      out.emplace_back(t.name + ".weight", w);
    }
  }
  for (const auto& [name, t] : out) bytes += t.nbytes();

  nlohmann::json config = spec.config;
  config["torch_dtype"] = opt.dtype == DType::kBF16 ? "bfloat16" : opt.dtype == DType::kF16 ? "float16" : "float32";
  if (opt.bits != 0 || !quant.empty()) {
    nlohmann::json block = quant;
    if (opt.bits != 0) {
      block["group_size"] = opt.group_size;
      block["bits"] = opt.bits;
      block["mode"] = "affine";
    }
    config["quantization"] = block;
    config["quantization_config"] = block;
  }
  std::filesystem::create_directories(out_dir);
  {
    std::ofstream f(out_dir + "/config.json");
    MOECEL_CHECK(f.good(), "cannot write {}/config.json", out_dir);
    f << config.dump(2) << "\n";
  }
  write_safetensors(out_dir + "/model.safetensors", out, {{"format", "mlx"}});
  return bytes;
}

float preset_config(TestModelSpec& s, const std::string& model_type, const std::string& arch_class,
                    const nlohmann::json& base, const std::vector<TestPreset>& presets, const std::string& preset,
                    const nlohmann::json& overrides) {
  s.config = {{"model_type", model_type},
              {"architectures", {arch_class}},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", false}};
  s.config.update(base);
  if (preset == "tiny") {
    s.config.update({{"vocab_size", 512},
                     {"hidden_size", 128},
                     {"num_attention_heads", 4},
                     {"max_position_embeddings", 512},
                     {"eos_token_id", 511}});
  }
  std::string names;
  for (const TestPreset& p : presets) {
    if (p.name == preset) {
      s.config.update(p.fields);
      s.config.update(overrides);
      return preset == "tiny" ? 0.08f : 0.02f;
    }
    names += (names.empty() ? "" : " or ") + p.name;
  }
  fail("unknown {} preset '{}': expected {}", model_type, preset, names);
}

void add_decoder_tensors(TestModelSpec& s, const DecoderTensorShape& d, float std,
                         const std::function<void(int64_t layer, const std::string& prefix)>& ffn) {
  const int64_t h = d.hidden_size, qw = d.q_width, kw = d.kv_width;
  s.tensors.push_back({"model.embed_tokens", {d.vocab_size, h}, true, 1.0f});
  for (int64_t l = 0; l < d.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".", a = p + "self_attn.";
    s.tensors.push_back({p + "input_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({p + "post_attention_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({a + "q_proj", {qw, h}, true, std});
    s.tensors.push_back({a + "k_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "v_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "o_proj", {h, qw}, true, std});
    if (d.q_norm > 0) s.tensors.push_back({a + "q_norm.weight", {d.q_norm}, false, 0.1f});
    if (d.k_norm > 0) s.tensors.push_back({a + "k_norm.weight", {d.k_norm}, false, 0.1f});
    if (d.qkv_bias) {
      s.tensors.push_back({a + "q_proj.bias", {qw}, false, 0.1f});
      s.tensors.push_back({a + "k_proj.bias", {kw}, false, 0.1f});
      s.tensors.push_back({a + "v_proj.bias", {kw}, false, 0.1f});
    }
    if (d.o_bias) s.tensors.push_back({a + "o_proj.bias", {h}, false, 0.1f});
    ffn(l, p);
  }
  s.tensors.push_back({"model.norm.weight", {h}, false, 0.1f});
  s.tensors.push_back({"lm_head", {d.vocab_size, h}, true, std});
}

void add_moe_tensors(TestModelSpec& s, const std::string& prefix, int64_t n_experts, int64_t hidden, int64_t ffn,
                     float std) {
  s.tensors.push_back({prefix + "gate", {n_experts, hidden}, true, std * 4});
  add_expert_tensors(s, prefix + "switch_mlp.", n_experts, hidden, ffn, std);
}

void add_gated_mlp_tensors(TestModelSpec& s, const std::string& prefix, int64_t hidden, int64_t ffn, float std) {
  s.tensors.push_back({prefix + "gate_proj", {ffn, hidden}, true, std});
  s.tensors.push_back({prefix + "up_proj", {ffn, hidden}, true, std});
  s.tensors.push_back({prefix + "down_proj", {hidden, ffn}, true, std});
}

void add_expert_tensors(TestModelSpec& s, const std::string& prefix, int64_t n_experts, int64_t hidden, int64_t ffn,
                        float std) {
  s.tensors.push_back({prefix + "gate_proj", {n_experts, ffn, hidden}, true, std});
  s.tensors.push_back({prefix + "up_proj", {n_experts, ffn, hidden}, true, std});
  s.tensors.push_back({prefix + "down_proj", {n_experts, hidden, ffn}, true, std});
}

}  // namespace moecel
