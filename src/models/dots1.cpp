// dots.llm1 (model_type "dots1", rednote-hilab/dots.llm1): the shared decoder with per-head q/k RMSNorm, optional
// attention biases and sliding layers; the first first_k_dense_replace layers are dense, the rest MoE blocks with a
// sigmoid router whose e_score_correction_bias only selects experts, grouped top-k (n_group, topk_group),
// norm_topk_prob and routed_scaling_factor on the weights, plus always-on shared experts.
// Semantics follow transformers' modeling_dots1.py; weights bind by the checkpoint's names (mlx-community stacks the
// routed experts as `mlp.experts.{gate,up,down}_proj`, HF keeps `mlp.experts.E.*` or fused `gate_up_proj`).
#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/test_model.h"

namespace moecel {
namespace {

struct Dots1Config : DecoderConfig {
  int64_t intermediate_size, moe_intermediate_size, n_experts, n_shared_experts, n_experts_per_tok;
  int64_t first_k_dense_replace, n_group, topk_group;
  double routed_scaling_factor;
  bool norm_topk_prob, attention_bias;
  std::vector<int> window;  // per layer: sliding window (0: full causal)

  explicit Dots1Config(const ModelConfig& c) : DecoderConfig(c, 1e-6, 10000.0, 2048) {
    intermediate_size = c.get_int_or("intermediate_size", 10944, 1, 1 << 20);
    moe_intermediate_size = c.get_int_or("moe_intermediate_size", 1408, 1, 1 << 20);
    first_k_dense_replace = c.get_int_or("first_k_dense_replace", 0, 0, n_layers);
    const bool any_moe = first_k_dense_replace < n_layers;
    n_experts = any_moe ? c.get_int(field_alias(c, {"n_routed_experts", "num_local_experts"}), 1, 1 << 16) : 0;
    n_experts_per_tok = any_moe ? c.get_int("num_experts_per_tok", 1, n_experts) : 0;
    n_shared_experts = c.get_int_or("n_shared_experts", 0, 0, 1 << 10);  // null or 0: none (as mlx-lm reads it)
    n_group = c.get_int_or("n_group", 1, 1, 1 << 16);
    topk_group = c.get_int_or("topk_group", 1, 1, 1 << 16);
    MOECEL_CHECK(!any_moe || n_experts % n_group == 0, "{}: n_routed_experts {} is not a multiple of n_group {}",
                 c.source(), n_experts, n_group);
    routed_scaling_factor = c.get_float_or("routed_scaling_factor", 1.0);
    norm_topk_prob = c.get_bool_or("norm_topk_prob", false);
    attention_bias = c.get_bool_or("attention_bias", false);
    // transformers: layers from max_window_layers on slide over sliding_window keys, unless layer_types says.
    const int64_t sliding_window = window_field(c, "sliding_window", 4096);
    const int64_t max_window_layers = c.get_int_or("max_window_layers", 62, 0, 1 << 20);
    window = layer_windows(c, n_layers, sliding_window,
                           [&](int64_t l) { return sliding_window > 0 && l >= max_window_layers; });
  }
  bool moe_layer(int64_t l) const { return l >= first_k_dense_replace; }
  AttentionOptions attention() const { return {.qkv_bias = attention_bias, .o_bias = attention_bias, .qk_norm = true}; }
};

struct MoeBlock {
  LinearWeight router;     // (n_experts, hidden_size)
  Tensor correction_bias;  // (n_experts,): added to the sigmoid scores for selection only
  SwitchGLU experts;
  GatedMlp shared;  // moe_intermediate_size * n_shared_experts wide; absent when n_shared_experts is 0
};

class Dots1 final : public DecoderModel {
 public:
  explicit Dots1(const ModelContext& ctx) : DecoderModel(ctx.backend, Dots1Config(ctx.config)), cfg_(ctx.config) {
    WeightLoader wl(ctx.store, ctx.config, ctx.backend);
    load_backbone(wl, cfg_.attention(), cfg_.window);
    const int64_t h = cfg_.hidden_size, e = cfg_.n_experts;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp";
      if (!cfg_.moe_layer(l)) {
        ffn_.add_dense(load_gated_mlp(wl, p, h, cfg_.intermediate_size));
        continue;
      }
      MoeBlock b;
      b.router = wl.linear(p + ".gate", e, h);
      b.correction_bias = wl.vector(p + ".gate.e_score_correction_bias", e);
      // mlx-lm stacks the routed experts under the module's own name, "experts".
      b.experts = SwitchGLU(wl.experts(p, e, h, cfg_.moe_intermediate_size, {}, "experts"), Activation::kSiLU);
      if (cfg_.n_shared_experts > 0) {
        b.shared = load_gated_mlp(wl, p + ".shared_experts", h, cfg_.moe_intermediate_size * cfg_.n_shared_experts);
      }
      const size_t always_read =
          b.router.total_bytes() + b.correction_bias.nbytes() + (cfg_.n_shared_experts > 0 ? b.shared.bytes() : 0);
      ffn_.add_moe(std::move(b), always_read, e, cfg_.n_experts_per_tok);
    }
    wl.check_all_used();
    fill_info(ctx.config, ffn_.n_moe, ffn_.total, ffn_.active);
  }

 protected:
  // Every output below is fully written by its op, hence scratch (no memset).
  Tensor feed_forward(Backend& be, size_t l, const Tensor& xn) const override {
    if (!cfg_.moe_layer(int64_t(l))) return ffn_.dense[l].forward(be, xn);
    const MoeBlock& b = ffn_.moe[l];
    const int64_t n = xn.dim(0), k = cfg_.n_experts_per_tok;
    Tensor logits = be.scratch(DType::kF32, {n, cfg_.n_experts});
    Tensor idx = be.scratch(DType::kI32, {n, k}), w = be.scratch(DType::kF32, {n, k});
    be.linear(b.router, xn, logits);
    be.router_grouped_topk(logits, b.correction_bias, int(cfg_.n_group), int(cfg_.topk_group), int(k),
                           cfg_.norm_topk_prob, float(cfg_.routed_scaling_factor), idx, w);
    Tensor y = b.experts.forward(be, xn, idx, w);  // (n_tokens, hidden_size)
    if (cfg_.n_shared_experts > 0) {
      Tensor shared = b.shared.forward(be, xn);
      be.add(y, shared, y);
    }
    return y;
  }

 private:
  Dots1Config cfg_;
  LayerFfns<MoeBlock> ffn_;
};

// Random checkpoints of dots.llm1 shape: "tiny" for tests (layer 0 dense, 16 experts in 4 groups, 2 kept), and
// "dots.llm1" with the real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec dots1_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  const nlohmann::json base = {
      {"norm_topk_prob", true}, {"attention_bias", false}, {"sliding_window", nullptr}, {"bos_token_id", nullptr}};
  const float std = preset_config(s, "dots1", "Dots1ForCausalLM", base,
                                  {{"tiny",
                                    {{"intermediate_size", 256},
                                     {"moe_intermediate_size", 64},
                                     {"num_hidden_layers", 3},
                                     {"first_k_dense_replace", 1},
                                     {"num_key_value_heads", 2},
                                     {"n_routed_experts", 16},
                                     {"n_shared_experts", 2},
                                     {"num_experts_per_tok", 4},
                                     {"n_group", 4},
                                     {"topk_group", 2},
                                     {"routed_scaling_factor", 2.5},
                                     {"rms_norm_eps", 1e-5},
                                     {"rope_theta", 10000.0}}},
                                   {"dots.llm1",
                                    {{"vocab_size", 152064},
                                     {"hidden_size", 4096},
                                     {"intermediate_size", 10944},
                                     {"moe_intermediate_size", 1408},
                                     {"num_hidden_layers", 62},
                                     {"first_k_dense_replace", 1},
                                     {"num_attention_heads", 32},
                                     {"num_key_value_heads", 32},
                                     {"n_routed_experts", 128},
                                     {"n_shared_experts", 2},
                                     {"num_experts_per_tok", 6},
                                     {"n_group", 1},
                                     {"topk_group", 1},
                                     {"routed_scaling_factor", 2.5},
                                     {"max_position_embeddings", 32768},
                                     {"rms_norm_eps", 1e-5},
                                     {"rope_theta", 10000000.0},
                                     {"eos_token_id", 151649}}}},
                                  preset, overrides);
  const Dots1Config c(ModelConfig::from_json(s.config, "test model config"));
  const int64_t h = c.hidden_size, e = c.n_experts, f = c.moe_intermediate_size;
  add_decoder_tensors(s, c.test_shape(c.attention()), std, [&](int64_t l, const std::string& p) {
    const std::string m = p + "mlp.";
    if (!c.moe_layer(l)) return add_gated_mlp_tensors(s, m, h, c.intermediate_size, std);
    // mlx-community keeps this router dense (mlx-lm's Dots1TopkRouter is not a Linear); here it is a centered random
    // linear layer like the others, quantized with them (the loader reads both; --override mlp.gate=8 as for qwen).
    s.tensors.push_back({m + "gate", {e, h}, true, std * 4});
    s.tensors.push_back({m + "gate.e_score_correction_bias", {e}, false, 0.05f});
    // Stacked routed experts as mlx-lm names them; the writer's HF layout (one tensor per expert) needs the
    // ".switch_mlp." spelling, so dense checkpoints keep the stacked tensors (a layout the loader also reads).
    add_expert_tensors(s, m + "experts.", e, h, f, std);
    if (c.n_shared_experts > 0) add_gated_mlp_tensors(s, m + "shared_experts.", h, f * c.n_shared_experts, std);
  });
  return s;
}

}  // namespace

const Architecture& dots1_architecture() {
  static const Architecture arch{"dots1", &load_as<Dots1>, &dots1_test_model, {"tiny", "dots.llm1"}};
  return arch;
}

}  // namespace moecel
