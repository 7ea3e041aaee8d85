// Qwen2-MoE (model_type "qwen2_moe", Qwen/Qwen1.5-MoE-A2.7B): the shared decoder with q/k/v biases and GQA; MoE
// layers route a softmax top-k (renormalized only with norm_topk_prob) over SwiGLU experts and add a shared expert
// scaled by sigmoid(shared_expert_gate(x)); decoder_sparse_step / mlp_only_layers make some layers dense.
// Semantics follow transformers' modeling_qwen2_moe.py; weights bind by the checkpoint's names (mlx-community
// `mlp.switch_mlp.*`, HF per-expert `mlp.experts.E.*` or fused `mlp.experts.gate_up_proj`).
#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/test_model.h"

namespace moecel {
namespace {

struct Qwen2MoeConfig : DecoderConfig, SparseStepMoeConfig {
  int64_t intermediate_size, shared_expert_intermediate_size;
  bool qkv_bias;
  std::vector<int> window;  // per layer: sliding window (0: full causal)

  explicit Qwen2MoeConfig(const ModelConfig& c)
      : DecoderConfig(c, 1e-6, 10000.0, 32768), SparseStepMoeConfig(c, n_layers, "num_experts", 60) {
    intermediate_size = c.get_int_or("intermediate_size", 5632, 1, 1 << 20);
    shared_expert_intermediate_size = any_moe() ? c.get_int("shared_expert_intermediate_size", 1, 1 << 20) : 0;
    qkv_bias = c.get_bool_or("qkv_bias", true);
    // transformers: sliding_window only counts with use_sliding_window; by default the even layers below
    // max_window_layers slide (configuration_qwen2_moe.py), unless layer_types says otherwise.
    const bool use_sliding = c.get_bool_or("use_sliding_window", false);
    const int64_t sliding_window = use_sliding ? window_field(c, "sliding_window", 4096) : 0;
    const int64_t max_window_layers = c.get_int_or("max_window_layers", 28, 0, 1 << 20);
    window = layer_windows(c, n_layers, sliding_window,
                           [&](int64_t l) { return use_sliding && l % 2 == 0 && l < max_window_layers; });
  }
  AttentionOptions attention() const { return {.qkv_bias = qkv_bias}; }
};

struct MoeBlock {
  LinearWeight router;       // (n_experts, hidden_size)
  SwitchGLU experts;         // routed experts
  GatedMlp shared;           // shared expert (shared_expert_intermediate_size)
  LinearWeight shared_gate;  // (1, hidden_size)
};

class Qwen2Moe final : public DecoderModel {
 public:
  explicit Qwen2Moe(const ModelContext& ctx) : DecoderModel(ctx.backend, Qwen2MoeConfig(ctx.config)), cfg_(ctx.config) {
    WeightLoader wl(ctx.store, ctx.config, ctx.backend);
    load_backbone(wl, cfg_.attention(), cfg_.window);
    const int64_t h = cfg_.hidden_size;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp";
      if (!cfg_.moe_layer[size_t(l)]) {
        ffn_.add_dense(load_gated_mlp(wl, p, h, cfg_.intermediate_size));
        continue;
      }
      MoeBlock b;
      b.router = wl.linear(p + ".gate", cfg_.n_experts, h);
      b.experts = SwitchGLU(wl.experts(p, cfg_.n_experts, h, cfg_.moe_intermediate_size), Activation::kSiLU);
      b.shared = load_gated_mlp(wl, p + ".shared_expert", h, cfg_.shared_expert_intermediate_size);
      b.shared_gate = wl.linear(p + ".shared_expert_gate", 1, h);
      const size_t always_read = b.router.total_bytes() + b.shared.bytes() + b.shared_gate.total_bytes();
      ffn_.add_moe(std::move(b), always_read, cfg_.n_experts, cfg_.n_experts_per_tok);
    }
    wl.check_all_used();
    fill_info(ctx.config, ffn_.n_moe, ffn_.total, ffn_.active);
  }

 protected:
  // Every output below is fully written by its op, hence scratch (no memset).
  Tensor feed_forward(Backend& be, size_t l, const Tensor& xn) const override {
    if (!cfg_.moe_layer[l]) return ffn_.dense[l].forward(be, xn);
    const MoeBlock& b = ffn_.moe[l];
    Tensor y = route_topk(be, b.router, b.experts, xn, RouterScoring::kSoftmax, cfg_.n_experts_per_tok,
                          cfg_.norm_topk_prob);  // (n_tokens, hidden_size)
    Tensor shared = b.shared.forward(be, xn);
    Tensor gate = be.scratch(DType::kF32, {xn.dim(0), 1});
    be.linear(b.shared_gate, xn, gate);
    be.add_sigmoid_gated(y, gate, shared, y);  // y + sigmoid(shared_expert_gate(x)) * shared_expert(x)
    return y;
  }

 private:
  Qwen2MoeConfig cfg_;
  LayerFfns<MoeBlock> ffn_;
};

// Random checkpoints of Qwen2-MoE shape: "tiny" for tests (layer 1 dense through mlp_only_layers), and
// "qwen1.5-moe-a2.7b" with the real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec qwen2_moe_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  const nlohmann::json base = {
      {"norm_topk_prob", false}, {"decoder_sparse_step", 1}, {"use_sliding_window", false}, {"bos_token_id", nullptr}};
  const float std = preset_config(s, "qwen2_moe", "Qwen2MoeForCausalLM", base,
                                  {{"tiny",
                                    {{"intermediate_size", 256},
                                     {"moe_intermediate_size", 64},
                                     {"shared_expert_intermediate_size", 128},
                                     {"num_hidden_layers", 3},
                                     {"mlp_only_layers", {1}},
                                     {"num_key_value_heads", 2},
                                     {"num_experts", 8},
                                     {"num_experts_per_tok", 2},
                                     {"rms_norm_eps", 1e-6},
                                     {"rope_theta", 10000.0}}},
                                   {"qwen1.5-moe-a2.7b",
                                    {{"vocab_size", 151936},
                                     {"hidden_size", 2048},
                                     {"intermediate_size", 5632},
                                     {"moe_intermediate_size", 1408},
                                     {"shared_expert_intermediate_size", 5632},
                                     {"num_hidden_layers", 24},
                                     {"mlp_only_layers", nlohmann::json::array()},
                                     {"num_attention_heads", 16},
                                     {"num_key_value_heads", 16},
                                     {"num_experts", 60},
                                     {"num_experts_per_tok", 4},
                                     {"max_position_embeddings", 8192},
                                     {"rms_norm_eps", 1e-6},
                                     {"rope_theta", 1000000.0},
                                     {"eos_token_id", 151643}}}},
                                  preset, overrides);
  const Qwen2MoeConfig c(ModelConfig::from_json(s.config, "test model config"));
  const int64_t h = c.hidden_size;
  add_decoder_tensors(s, c.test_shape(c.attention()), std, [&](int64_t l, const std::string& p) {
    const std::string m = p + "mlp.";
    if (!c.moe_layer[size_t(l)]) return add_gated_mlp_tensors(s, m, h, c.intermediate_size, std);
    add_moe_tensors(s, m, c.n_experts, h, c.moe_intermediate_size, std);
    add_gated_mlp_tensors(s, m + "shared_expert.", h, c.shared_expert_intermediate_size, std);
    s.tensors.push_back({m + "shared_expert_gate", {1, h}, true, std});
  });
  return s;
}

}  // namespace

const Architecture& qwen2_moe_architecture() {
  static const Architecture arch{"qwen2_moe", &load_as<Qwen2Moe>, &qwen2_moe_test_model, {"tiny", "qwen1.5-moe-a2.7b"}};
  return arch;
}

}  // namespace moecel
