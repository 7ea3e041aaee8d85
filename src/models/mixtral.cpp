// Mixtral (model_type "mixtral", mistralai/Mixtral-8x7B): the shared decoder with GQA, an optional explicit head_dim
// and a sliding window over every layer when sliding_window is set; every layer is a MoE block that takes the top-k
// router logits and softmaxes over those k (the same weights as transformers' softmax + top-k + renormalize).
// Weights: mlx-community `block_sparse_moe.switch_mlp.{gate,up,down}_proj`, HF per-expert
// `block_sparse_moe.experts.E.{w1,w3,w2}` (= gate, up, down), or transformers 5's fused `mlp.experts.gate_up_proj`
// with the router at `mlp.gate`. Semantics follow transformers' modeling_mixtral.py.
#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/test_model.h"

namespace moecel {
namespace {

struct MixtralConfig : DecoderConfig {
  int64_t intermediate_size, n_experts, n_experts_per_tok;
  int window;  // sliding window of every layer (0: full causal)

  explicit MixtralConfig(const ModelConfig& c) : DecoderConfig(c, 1e-5, 1000000.0, 4096 * 32) {
    intermediate_size = c.get_int_or("intermediate_size", 14336, 1, 1 << 20);
    n_experts = c.get_int_or(field_alias(c, {"num_local_experts", "num_experts"}), 8, 1, 1 << 16);
    n_experts_per_tok = c.get_int_or("num_experts_per_tok", 2, 1, n_experts);
    window = int(window_field(c, "sliding_window", 0));
  }
};

struct MoeBlock {
  LinearWeight router;  // (n_experts, hidden_size)
  SwitchGLU experts;
};

class Mixtral final : public DecoderModel {
 public:
  explicit Mixtral(const ModelContext& ctx) : DecoderModel(ctx.backend, MixtralConfig(ctx.config)), cfg_(ctx.config) {
    WeightLoader wl(ctx.store, ctx.config, ctx.backend);
    load_backbone(wl, {}, std::vector<int>(size_t(cfg_.n_layers), cfg_.window));
    const int64_t h = cfg_.hidden_size, e = cfg_.n_experts, f = cfg_.intermediate_size;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      // The checkpoint's own module name: block_sparse_moe (mlx-community, HF) or mlp (transformers 5, fused).
      const std::string m = wl.has(p + ".block_sparse_moe.gate.weight") ? p + ".block_sparse_moe" : p + ".mlp";
      MoeBlock b;
      b.router = wl.linear(m + ".gate", e, h);
      // Per-expert HF tensors are named w1/w3/w2; stacked and fused ones carry gate_proj / up_proj / down_proj.
      const ExpertNames names = wl.has(m + ".experts.0.w1.weight") ? ExpertNames{"w1", "w3", "w2"} : ExpertNames{};
      b.experts = SwitchGLU(wl.experts(m, e, h, f, names), Activation::kSiLU);
      const size_t router_bytes = b.router.total_bytes();
      ffn_.add_moe(std::move(b), router_bytes, e, cfg_.n_experts_per_tok);
    }
    wl.check_all_used();
    fill_info(ctx.config, ffn_.n_moe, ffn_.total, ffn_.active);
  }

 protected:
  std::optional<RoutedFfn> routed_ffn(size_t l) const override {
    const MoeBlock& b = ffn_.moe[l];
    return RoutedFfn{&b.router, &b.experts, RouterScoring::kTopKSoftmax, cfg_.n_experts_per_tok, false};
  }

 private:
  MixtralConfig cfg_;
  LayerFfns<MoeBlock> ffn_;  // every layer a MoE block
};

// Random checkpoints of Mixtral shape: "tiny" for tests (GQA 4/2, sliding window 16), and "mixtral-8x7b" with the
// real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec mixtral_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  const float std = preset_config(s, "mixtral", "MixtralForCausalLM", {{"bos_token_id", 1}},
                                  {{"tiny",
                                    {{"intermediate_size", 64},
                                     {"num_hidden_layers", 2},
                                     {"num_key_value_heads", 2},
                                     {"num_local_experts", 8},
                                     {"num_experts_per_tok", 2},
                                     {"sliding_window", 16},
                                     {"rms_norm_eps", 1e-5},
                                     {"rope_theta", 1000000.0}}},
                                   {"mixtral-8x7b",
                                    {{"vocab_size", 32000},
                                     {"hidden_size", 4096},
                                     {"intermediate_size", 14336},
                                     {"num_hidden_layers", 32},
                                     {"num_attention_heads", 32},
                                     {"num_key_value_heads", 8},
                                     {"num_local_experts", 8},
                                     {"num_experts_per_tok", 2},
                                     {"max_position_embeddings", 32768},
                                     {"sliding_window", nullptr},
                                     {"rms_norm_eps", 1e-5},
                                     {"rope_theta", 1000000.0},
                                     {"eos_token_id", 2}}}},
                                  preset, overrides);
  const MixtralConfig c(ModelConfig::from_json(s.config, "test model config"));
  const int64_t h = c.hidden_size;
  add_decoder_tensors(s, c.test_shape({}), std, [&](int64_t, const std::string& p) {
    add_moe_tensors(s, p + "block_sparse_moe.", c.n_experts, h, c.intermediate_size, std);
  });
  return s;
}

}  // namespace

const Architecture& mixtral_architecture() {
  static const Architecture arch{"mixtral", &load_as<Mixtral>, &mixtral_test_model, {"tiny", "mixtral-8x7b"}};
  return arch;
}

}  // namespace moecel
