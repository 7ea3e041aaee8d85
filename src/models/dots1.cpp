// dots.llm1 (model_type "dots1", rednote-hilab/dots.llm1): the shared decoder with per-head q/k RMSNorm, optional
// attention biases and sliding layers; the first first_k_dense_replace layers are dense, the rest MoE blocks with a
// sigmoid router whose e_score_correction_bias only selects experts, grouped top-k (n_group, topk_group),
// norm_topk_prob and routed_scaling_factor on the weights, plus always-on shared experts.
// Semantics follow transformers' modeling_dots1.py; weights bind by the checkpoint's names (mlx-community stacks the
// routed experts as `mlp.experts.{gate,up,down}_proj`, HF keeps `mlp.experts.E.*` or fused `gate_up_proj`).
#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/switch_glu.h"

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
    std::vector<bool> sliding = sliding_layer_types(c, n_layers);
    for (int64_t l = 0; l < n_layers && sliding.size() < size_t(n_layers); ++l) {
      sliding.push_back(sliding_window > 0 && l >= max_window_layers);
    }
    for (int64_t l = 0; l < n_layers; ++l) {
      MOECEL_CHECK(!sliding[size_t(l)] || sliding_window > 0,
                   "{}: layer {} uses sliding attention but sliding_window is not set", c.source(), l);
      window.push_back(sliding[size_t(l)] ? int(sliding_window) : 0);
    }
  }
  bool moe_layer(int64_t l) const { return l >= first_k_dense_replace; }
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
    load_backbone(wl, {.qkv_bias = cfg_.attention_bias, .o_bias = cfg_.attention_bias, .qk_norm = true}, cfg_.window);
    const int64_t h = cfg_.hidden_size, e = cfg_.n_experts;
    size_t ffn_total = 0, ffn_active = 0;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp";
      if (!cfg_.moe_layer(l)) {
        dense_.push_back(load_gated_mlp(wl, p, h, cfg_.intermediate_size));
        moe_.emplace_back();
        ffn_total += dense_.back().bytes();
        ffn_active += dense_.back().bytes();
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
      const size_t common =
          b.router.total_bytes() + b.correction_bias.nbytes() + (cfg_.n_shared_experts > 0 ? b.shared.bytes() : 0);
      ffn_total += common + b.experts.bytes_per_expert() * size_t(e);
      ffn_active += common + b.experts.bytes_per_expert() * size_t(cfg_.n_experts_per_tok);
      moe_.push_back(std::move(b));
      dense_.emplace_back();
    }
    wl.check_all_used();
    fill_info(ctx.config, cfg_.n_layers - cfg_.first_k_dense_replace, ffn_total, ffn_active);
  }

 protected:
  // Every output below is fully written by its op, hence scratch (no memset).
  Tensor feed_forward(Backend& be, size_t l, const Tensor& xn) const override {
    if (!cfg_.moe_layer(int64_t(l))) return dense_[l].forward(be, xn);
    const MoeBlock& b = moe_[l];
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
  std::vector<MoeBlock> moe_;    // per layer (empty for dense layers)
  std::vector<GatedMlp> dense_;  // per layer (empty for MoE layers)
};

std::unique_ptr<Model> load_dots1(const ModelContext& ctx) {
  return std::make_unique<Dots1>(ctx);
}

// Random checkpoints of dots.llm1 shape: "tiny" for tests (layer 0 dense, 16 experts in 4 groups, 2 kept), and
// "dots.llm1" with the real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec dots1_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  s.config = {{"model_type", "dots1"},        {"architectures", {"Dots1ForCausalLM"}},
              {"hidden_act", "silu"},         {"norm_topk_prob", true},
              {"attention_bias", false},      {"sliding_window", nullptr},
              {"tie_word_embeddings", false}, {"bos_token_id", nullptr}};
  float std = 0.02f;
  if (preset == "tiny") {
    s.config.update({{"vocab_size", 512},
                     {"hidden_size", 128},
                     {"intermediate_size", 256},
                     {"moe_intermediate_size", 64},
                     {"num_hidden_layers", 3},
                     {"first_k_dense_replace", 1},
                     {"num_attention_heads", 4},
                     {"num_key_value_heads", 2},
                     {"n_routed_experts", 16},
                     {"n_shared_experts", 2},
                     {"num_experts_per_tok", 4},
                     {"n_group", 4},
                     {"topk_group", 2},
                     {"routed_scaling_factor", 2.5},
                     {"max_position_embeddings", 512},
                     {"rms_norm_eps", 1e-5},
                     {"rope_theta", 10000.0},
                     {"eos_token_id", 511}});
    std = 0.08f;
  } else if (preset == "dots.llm1") {
    s.config.update({{"vocab_size", 152064},
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
                     {"eos_token_id", 151649}});
  } else {
    fail("unknown dots1 preset '{}': expected tiny or dots.llm1", preset);
  }
  s.config.update(overrides);
  const Dots1Config c(ModelConfig::from_json(s.config, "test model config"));
  const int64_t h = c.hidden_size, hd = c.head_dim, qw = c.n_heads * hd, kw = c.n_kv_heads * hd;
  s.tensors.push_back({"model.embed_tokens", {c.vocab_size, h}, true, 1.0f});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l), a = p + ".self_attn.", m = p + ".mlp.";
    s.tensors.push_back({p + ".input_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({p + ".post_attention_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({a + "q_proj", {qw, h}, true, std});
    s.tensors.push_back({a + "k_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "v_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "o_proj", {h, qw}, true, std});
    s.tensors.push_back({a + "q_norm.weight", {hd}, false, 0.1f});
    s.tensors.push_back({a + "k_norm.weight", {hd}, false, 0.1f});
    if (c.attention_bias) {
      for (auto [name, d] : {std::pair{"q_proj", qw}, {"k_proj", kw}, {"v_proj", kw}, {"o_proj", h}}) {
        s.tensors.push_back({a + name + ".bias", {d}, false, 0.1f});
      }
    }
    auto mlp = [&](const std::string& q, int64_t f) {
      s.tensors.push_back({q + "gate_proj", {f, h}, true, std});
      s.tensors.push_back({q + "up_proj", {f, h}, true, std});
      s.tensors.push_back({q + "down_proj", {h, f}, true, std});
    };
    if (!c.moe_layer(l)) {
      mlp(m, c.intermediate_size);
      continue;
    }
    const int64_t e = c.n_experts, f = c.moe_intermediate_size;
    // mlx-community keeps this router dense (mlx-lm's Dots1TopkRouter is not a Linear); here it is a centered random
    // linear layer like the others, quantized with them (the loader reads both; --override mlp.gate=8 as for qwen).
    s.tensors.push_back({m + "gate", {e, h}, true, std * 4});
    s.tensors.push_back({m + "gate.e_score_correction_bias", {e}, false, 0.05f});
    // Stacked routed experts as mlx-lm names them; the writer's HF layout (one tensor per expert) needs the
    // ".switch_mlp." spelling, so dense checkpoints keep the stacked tensors (a layout the loader also reads).
    s.tensors.push_back({m + "experts.gate_proj", {e, f, h}, true, std});
    s.tensors.push_back({m + "experts.up_proj", {e, f, h}, true, std});
    s.tensors.push_back({m + "experts.down_proj", {e, h, f}, true, std});
    if (c.n_shared_experts > 0) mlp(m + "shared_experts.", f * c.n_shared_experts);
  }
  s.tensors.push_back({"model.norm.weight", {h}, false, 0.1f});
  s.tensors.push_back({"lm_head", {c.vocab_size, h}, true, std});
  return s;
}

}  // namespace

const Architecture& dots1_architecture() {
  static const Architecture arch{"dots1", &load_dots1, &dots1_test_model, {"tiny", "dots.llm1"}};
  return arch;
}

}  // namespace moecel
