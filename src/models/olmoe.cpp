// OLMoE (model_type "olmoe", allenai/OLMoE-1B-7B): the shared decoder with full-width q/k RMSNorm (and the optional
// clip_qkv), NeoX rotary, and a softmax top-k MoE of SwiGLU experts with no shared expert. Semantics follow
// transformers' modeling_olmoe.py; weights are bound by the checkpoint's own names (mlx-community or HF layout).
#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/switch_glu.h"
#include "models/test_model.h"
#include "models/weights.h"

namespace moecel {
namespace {

struct OlmoeConfig : DecoderConfig {
  int64_t intermediate_size, n_experts, n_experts_per_tok;
  double clip_qkv;
  bool norm_topk_prob;

  explicit OlmoeConfig(const ModelConfig& c) : DecoderConfig(c, 1e-5, 10000.0, 4096) {
    intermediate_size = c.get_int("intermediate_size", 1, 1 << 20);
    n_experts = c.get_int("num_experts", 1, 1 << 16);
    n_experts_per_tok = c.get_int("num_experts_per_tok", 1, n_experts);
    clip_qkv = c.get_float_or("clip_qkv", 0.0);
    norm_topk_prob = c.get_bool_or("norm_topk_prob", false);
    MOECEL_CHECK(!c.get_bool_or("attention_bias", false), "{}: attention_bias true is not supported for olmoe",
                 c.source());
  }
  // OLMoE's q/k norms span the whole projection, (hidden_size,) and (kv width,), not one head.
  AttentionOptions attention() const { return {.qk_norm_full = true, .clip_qkv = clip_qkv}; }
};

struct MoeBlock {
  LinearWeight router;  // (n_experts, hidden_size)
  SwitchGLU experts;
};

class Olmoe final : public DecoderModel {
 public:
  explicit Olmoe(const ModelContext& ctx) : DecoderModel(ctx.backend, OlmoeConfig(ctx.config)), cfg_(ctx.config) {
    WeightLoader wl(ctx.store, ctx.config, ctx.backend);
    load_backbone(wl, cfg_.attention(), std::vector<int>(size_t(cfg_.n_layers), 0));
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp";
      MoeBlock b;
      b.router = wl.linear(p + ".gate", cfg_.n_experts, cfg_.hidden_size);
      b.experts = SwitchGLU(wl.experts(p, cfg_.n_experts, cfg_.hidden_size, cfg_.intermediate_size), Activation::kSiLU);
      const size_t router_bytes = b.router.total_bytes();
      ffn_.add_moe(std::move(b), router_bytes, cfg_.n_experts, cfg_.n_experts_per_tok);
    }
    wl.check_all_used();
    fill_info(ctx.config, ffn_.n_moe, ffn_.total, ffn_.active);
  }

 protected:
  // MoE: softmax over all experts, top-k (renormalized with norm_topk_prob), SwiGLU experts, no shared expert.
  std::optional<RoutedFfn> routed_ffn(size_t l) const override {
    return RoutedFfn{&ffn_.moe[l].router, &ffn_.moe[l].experts, RouterScoring::kSoftmax, cfg_.n_experts_per_tok,
                     cfg_.norm_topk_prob};
  }

 private:
  OlmoeConfig cfg_;
  LayerFfns<MoeBlock> ffn_;
};

// Random checkpoints of OLMoE shape: "tiny" for tests, "olmoe-1b-7b" with the real shapes for benchmarks.
// `overrides` are config.json fields that replace the preset's (e.g. {"intermediate_size": 256}).
TestModelSpec olmoe_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  const nlohmann::json base = {{"norm_topk_prob", false}, {"rms_norm_eps", 1e-5},    {"rope_theta", 10000.0},
                               {"clip_qkv", nullptr},     {"attention_bias", false}, {"bos_token_id", nullptr},
                               {"pad_token_id", 1}};
  const float std = preset_config(s, "olmoe", "OlmoeForCausalLM", base,
                                  {{"tiny",
                                    {{"intermediate_size", 128},
                                     {"num_hidden_layers", 2},
                                     {"num_key_value_heads", 4},
                                     {"num_experts", 8},
                                     {"num_experts_per_tok", 2}}},
                                   {"olmoe-1b-7b",
                                    {{"vocab_size", 50304},
                                     {"hidden_size", 2048},
                                     {"intermediate_size", 1024},
                                     {"num_hidden_layers", 16},
                                     {"num_attention_heads", 16},
                                     {"num_key_value_heads", 16},
                                     {"num_experts", 64},
                                     {"num_experts_per_tok", 8},
                                     {"max_position_embeddings", 4096},
                                     {"eos_token_id", 50279}}}},
                                  preset, overrides);
  const OlmoeConfig c(ModelConfig::from_json(s.config, "test model config"));
  add_decoder_tensors(s, c.test_shape(c.attention()), std, [&](int64_t, const std::string& p) {
    add_moe_tensors(s, p + "mlp.", c.n_experts, c.hidden_size, c.intermediate_size, std);
  });
  return s;
}

}  // namespace

const Architecture& olmoe_architecture() {
  static const Architecture arch{"olmoe", &load_as<Olmoe>, &olmoe_test_model, {"tiny", "olmoe-1b-7b"}};
  return arch;
}

}  // namespace moecel
