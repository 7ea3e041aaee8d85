// Mixtral (model_type "mixtral", mistralai/Mixtral-8x7B): the shared decoder with GQA, an optional explicit head_dim
// and a sliding window over every layer when sliding_window is set; every layer is a MoE block that takes the top-k
// router logits and softmaxes over those k (the same weights as transformers' softmax + top-k + renormalize).
// Weights: mlx-community `block_sparse_moe.switch_mlp.{gate,up,down}_proj`, HF per-expert
// `block_sparse_moe.experts.E.{w1,w3,w2}` (= gate, up, down), or transformers 5's fused `mlp.experts.gate_up_proj`
// with the router at `mlp.gate`. Semantics follow transformers' modeling_mixtral.py.
#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/switch_glu.h"

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
    size_t ffn_total = 0, ffn_active = 0;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      // The checkpoint's own module name: block_sparse_moe (mlx-community, HF) or mlp (transformers 5, fused).
      const std::string m = wl.has(p + ".block_sparse_moe.gate.weight") ? p + ".block_sparse_moe" : p + ".mlp";
      MoeBlock b;
      b.router = wl.linear(m + ".gate", e, h);
      // Per-expert HF tensors are named w1/w3/w2; stacked and fused ones carry gate_proj / up_proj / down_proj.
      const ExpertNames names = wl.has(m + ".experts.0.w1.weight") ? ExpertNames{"w1", "w3", "w2"} : ExpertNames{};
      b.experts = SwitchGLU(wl.experts(m, e, h, f, names), Activation::kSiLU);
      ffn_total += b.router.total_bytes() + b.experts.bytes_per_expert() * size_t(e);
      ffn_active += b.router.total_bytes() + b.experts.bytes_per_expert() * size_t(cfg_.n_experts_per_tok);
      moe_.push_back(std::move(b));
    }
    wl.check_all_used();
    fill_info(ctx.config, cfg_.n_layers, ffn_total, ffn_active);
  }

 protected:
  // Every output below is fully written by its op, hence scratch (no memset).
  Tensor feed_forward(Backend& be, size_t l, const Tensor& xn) const override {
    const MoeBlock& b = moe_[l];
    const int64_t n = xn.dim(0);
    Tensor logits = be.scratch(DType::kF32, {n, cfg_.n_experts});
    Tensor idx = be.scratch(DType::kI32, {n, cfg_.n_experts_per_tok});
    Tensor w = be.scratch(DType::kF32, {n, cfg_.n_experts_per_tok});
    be.linear(b.router, xn, logits);
    be.router_topk(logits, RouterScoring::kTopKSoftmax, int(cfg_.n_experts_per_tok), false, idx, w);
    return b.experts.forward(be, xn, idx, w);
  }

 private:
  MixtralConfig cfg_;
  std::vector<MoeBlock> moe_;
};

std::unique_ptr<Model> load_mixtral(const ModelContext& ctx) {
  return std::make_unique<Mixtral>(ctx);
}

// Random checkpoints of Mixtral shape: "tiny" for tests (GQA 4/2, sliding window 16), and "mixtral-8x7b" with the
// real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec mixtral_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  s.config = {{"model_type", "mixtral"},
              {"architectures", {"MixtralForCausalLM"}},
              {"hidden_act", "silu"},
              {"tie_word_embeddings", false},
              {"bos_token_id", 1}};
  float std = 0.02f;
  if (preset == "tiny") {
    s.config.update({{"vocab_size", 512},
                     {"hidden_size", 128},
                     {"intermediate_size", 64},
                     {"num_hidden_layers", 2},
                     {"num_attention_heads", 4},
                     {"num_key_value_heads", 2},
                     {"num_local_experts", 8},
                     {"num_experts_per_tok", 2},
                     {"max_position_embeddings", 512},
                     {"sliding_window", 16},
                     {"rms_norm_eps", 1e-5},
                     {"rope_theta", 1000000.0},
                     {"eos_token_id", 511}});
    std = 0.08f;
  } else if (preset == "mixtral-8x7b") {
    s.config.update({{"vocab_size", 32000},
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
                     {"eos_token_id", 2}});
  } else {
    fail("unknown mixtral preset '{}': expected tiny or mixtral-8x7b", preset);
  }
  s.config.update(overrides);
  const MixtralConfig c(ModelConfig::from_json(s.config, "test model config"));
  const int64_t h = c.hidden_size, qw = c.n_heads * c.head_dim, kw = c.n_kv_heads * c.head_dim;
  s.tensors.push_back({"model.embed_tokens", {c.vocab_size, h}, true, 1.0f});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l), a = p + ".self_attn.", m = p + ".block_sparse_moe.";
    s.tensors.push_back({p + ".input_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({p + ".post_attention_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({a + "q_proj", {qw, h}, true, std});
    s.tensors.push_back({a + "k_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "v_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "o_proj", {h, qw}, true, std});
    const int64_t e = c.n_experts, f = c.intermediate_size;
    s.tensors.push_back({m + "gate", {e, h}, true, std * 4});
    s.tensors.push_back({m + "switch_mlp.gate_proj", {e, f, h}, true, std});
    s.tensors.push_back({m + "switch_mlp.up_proj", {e, f, h}, true, std});
    s.tensors.push_back({m + "switch_mlp.down_proj", {e, h, f}, true, std});
  }
  s.tensors.push_back({"model.norm.weight", {h}, false, 0.1f});
  s.tensors.push_back({"lm_head", {c.vocab_size, h}, true, std});
  return s;
}

}  // namespace

const Architecture& mixtral_architecture() {
  static const Architecture arch{"mixtral", &load_mixtral, &mixtral_test_model, {"tiny", "mixtral-8x7b"}};
  return arch;
}

}  // namespace moecel
