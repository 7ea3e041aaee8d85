// Writes random checkpoints from an architecture's test-model recipe: the exact mlx-community layout when
// quantized (stacked experts, U32 weights, scales/biases, quantization block), HF layout when dense
// (one tensor per expert). Used by `moecel make-test-model`, tests and benchmarks.
#pragma once
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "models/registry.h"
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

// Recipe pieces the decoder families share (olmoe, qwen2_moe, qwen3_moe, mixtral, dots1).

struct TestPreset {
  std::string name;  // "tiny" or a real model's shape name
  nlohmann::json fields;
};
// Fills s.config: model_type, architectures [arch_class], hidden_act silu, untied embeddings, then `base`, for "tiny"
// the fields every tiny preset shares (vocab 512, hidden 128, 4 heads, 512 positions, eos 511), the named preset's
// fields and `overrides` (throws listing the presets). Returns the spread of the linear weights: 0.08 for
// "tiny" (a small model needs larger weights for lively logits and router choices), 0.02 for real shapes.
float preset_config(TestModelSpec& s, const std::string& model_type, const std::string& arch_class,
                    const nlohmann::json& base, const std::vector<TestPreset>& presets, const std::string& preset,
                    const nlohmann::json& overrides);

// The attention backbone's tensor shapes.
struct DecoderTensorShape {
  int64_t vocab_size, hidden_size, n_layers;
  int64_t q_width, kv_width;       // n_heads * head_dim, n_kv_heads * head_dim
  int64_t q_norm = 0, k_norm = 0;  // widths of self_attn.{q,k}_norm.weight (0: none)
  bool qkv_bias = false, o_bias = false;
};
// Appends model.embed_tokens, per layer the two norms, self_attn.{q,k,v,o}_proj, the q/k norms and biases, then
// ffn(layer, "model.layers.L."), and model.norm and lm_head. std: the spread of the linear layers.
void add_decoder_tensors(TestModelSpec& s, const DecoderTensorShape& d, float std,
                         const std::function<void(int64_t layer, const std::string& prefix)>& ffn);
// {prefix}gate (n_experts, hidden), a softmax router drawn 4x wider so routing is decisive, and the stacked experts
// {prefix}switch_mlp.*.
void add_moe_tensors(TestModelSpec& s, const std::string& prefix, int64_t n_experts, int64_t hidden, int64_t ffn,
                     float std);
// {prefix}gate_proj, up_proj (ffn, hidden) and down_proj (hidden, ffn): dense MLPs and shared experts.
void add_gated_mlp_tensors(TestModelSpec& s, const std::string& prefix, int64_t hidden, int64_t ffn, float std);
// {prefix}gate_proj, up_proj (n_experts, ffn, hidden) and down_proj (n_experts, hidden, ffn): stacked experts.
void add_expert_tensors(TestModelSpec& s, const std::string& prefix, int64_t n_experts, int64_t hidden, int64_t ffn,
                        float std);

}  // namespace moecel
