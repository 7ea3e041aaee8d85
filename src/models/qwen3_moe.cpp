// Qwen3-MoE (model_type "qwen3_moe", Qwen/Qwen3-30B-A3B): the shared decoder with per-head q/k RMSNorm, an explicit
// head_dim, GQA and optional attention biases (q/k/v/o); MoE layers route a softmax top-k (renormalized with
// norm_topk_prob) over SwiGLU experts, no shared expert; decoder_sparse_step / mlp_only_layers make some layers
// dense. Semantics follow transformers' modeling_qwen3_moe.py; weights bind by the checkpoint's names.
#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/test_model.h"

namespace moecel {
namespace {

struct Qwen3MoeConfig : DecoderConfig, SparseStepMoeConfig {
  int64_t intermediate_size;
  bool attention_bias;
  int window;  // sliding window of every layer (0: full causal)

  // transformers 5 writes num_local_experts (attribute_map alias of num_experts).
  explicit Qwen3MoeConfig(const ModelConfig& c)
      : DecoderConfig(c, 1e-6, 10000.0, 32768),
        SparseStepMoeConfig(c, n_layers, field_alias(c, {"num_experts", "num_local_experts"}), 128) {
    intermediate_size = c.get_int_or("intermediate_size", 6144, 1, 1 << 20);
    attention_bias = c.get_bool_or("attention_bias", false);
    // transformers: with use_sliding_window every layer slides over sliding_window keys.
    window = c.get_bool_or("use_sliding_window", false) ? int(window_field(c, "sliding_window", 4096)) : 0;
  }
  AttentionOptions attention() const { return {.qkv_bias = attention_bias, .o_bias = attention_bias, .qk_norm = true}; }
};

struct MoeBlock {
  LinearWeight router;  // (n_experts, hidden_size)
  SwitchGLU experts;
};

class Qwen3Moe final : public DecoderModel {
 public:
  explicit Qwen3Moe(const ModelContext& ctx) : DecoderModel(ctx.backend, Qwen3MoeConfig(ctx.config)), cfg_(ctx.config) {
    WeightLoader wl(ctx.store, ctx.config, ctx.backend);
    load_backbone(wl, cfg_.attention(), std::vector<int>(size_t(cfg_.n_layers), cfg_.window));
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
      const size_t router_bytes = b.router.total_bytes();
      ffn_.add_moe(std::move(b), router_bytes, cfg_.n_experts, cfg_.n_experts_per_tok);
    }
    wl.check_all_used();
    fill_info(ctx.config, ffn_.n_moe, ffn_.total, ffn_.active);
  }

 protected:
  Tensor feed_forward(Backend& be, size_t l, const Tensor& xn) const override {  // dense layers; MoE: routed_ffn
    if (!cfg_.moe_layer[l]) return ffn_.dense[l].forward(be, xn);
    return DecoderModel::feed_forward(be, l, xn);
  }
  std::optional<RoutedFfn> routed_ffn(size_t l) const override {
    if (!cfg_.moe_layer[l]) return std::nullopt;
    const MoeBlock& b = ffn_.moe[l];
    return RoutedFfn{&b.router, &b.experts, RouterScoring::kSoftmax, cfg_.n_experts_per_tok, cfg_.norm_topk_prob};
  }

 private:
  Qwen3MoeConfig cfg_;
  LayerFfns<MoeBlock> ffn_;
};

// Random checkpoints of Qwen3-MoE shape: "tiny" for tests (head_dim 64 with hidden 128 and 4 heads, GQA 4/2), and
// "qwen3-30b-a3b" with the real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec qwen3_moe_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  const nlohmann::json base = {
      {"norm_topk_prob", true},  {"decoder_sparse_step", 1},    {"mlp_only_layers", nlohmann::json::array()},
      {"attention_bias", false}, {"use_sliding_window", false}, {"bos_token_id", nullptr}};
  const float std = preset_config(s, "qwen3_moe", "Qwen3MoeForCausalLM", base,
                                  {{"tiny",
                                    {{"head_dim", 64},
                                     {"intermediate_size", 256},
                                     {"moe_intermediate_size", 64},
                                     {"num_hidden_layers", 2},
                                     {"num_key_value_heads", 2},
                                     {"num_experts", 8},
                                     {"num_experts_per_tok", 2},
                                     {"rms_norm_eps", 1e-6},
                                     {"rope_theta", 10000.0}}},
                                   {"qwen3-30b-a3b",
                                    {{"vocab_size", 151936},
                                     {"hidden_size", 2048},
                                     {"head_dim", 128},
                                     {"intermediate_size", 6144},
                                     {"moe_intermediate_size", 768},
                                     {"num_hidden_layers", 48},
                                     {"num_attention_heads", 32},
                                     {"num_key_value_heads", 4},
                                     {"num_experts", 128},
                                     {"num_experts_per_tok", 8},
                                     {"max_position_embeddings", 40960},
                                     {"rms_norm_eps", 1e-6},
                                     {"rope_theta", 1000000.0},
                                     {"eos_token_id", 151645}}}},
                                  preset, overrides);
  const Qwen3MoeConfig c(ModelConfig::from_json(s.config, "test model config"));
  const int64_t h = c.hidden_size;
  add_decoder_tensors(s, c.test_shape(c.attention()), std, [&](int64_t l, const std::string& p) {
    const std::string m = p + "mlp.";
    if (!c.moe_layer[size_t(l)]) return add_gated_mlp_tensors(s, m, h, c.intermediate_size, std);
    add_moe_tensors(s, m, c.n_experts, h, c.moe_intermediate_size, std);
  });
  return s;
}

}  // namespace

const Architecture& qwen3_moe_architecture() {
  static const Architecture arch{"qwen3_moe", &load_as<Qwen3Moe>, &qwen3_moe_test_model, {"tiny", "qwen3-30b-a3b"}};
  return arch;
}

}  // namespace moecel
