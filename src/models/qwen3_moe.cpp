// Qwen3-MoE (model_type "qwen3_moe", Qwen/Qwen3-30B-A3B): the shared decoder with per-head q/k RMSNorm, an explicit
// head_dim, GQA and optional attention biases (q/k/v/o); MoE layers route a softmax top-k (renormalized with
// norm_topk_prob) over SwiGLU experts, no shared expert; decoder_sparse_step / mlp_only_layers make some layers
// dense. Semantics follow transformers' modeling_qwen3_moe.py; weights bind by the checkpoint's names.
#include <algorithm>

#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/switch_glu.h"

namespace moecel {
namespace {

struct Qwen3MoeConfig : DecoderConfig {
  int64_t intermediate_size, moe_intermediate_size, n_experts, n_experts_per_tok;
  bool norm_topk_prob, attention_bias;
  std::vector<bool> moe_layer;  // per layer: sparse MoE block (else a dense MLP)
  int window;                   // sliding window of every layer (0: full causal)

  explicit Qwen3MoeConfig(const ModelConfig& c) : DecoderConfig(c, 1e-6, 10000.0, 32768) {
    intermediate_size = c.get_int_or("intermediate_size", 6144, 1, 1 << 20);
    // transformers 5 writes num_local_experts (attribute_map alias of num_experts).
    n_experts = c.get_int_or(field_alias(c, {"num_experts", "num_local_experts"}), 128, 0, 1 << 16);
    const int64_t sparse_step = c.get_int_or("decoder_sparse_step", 1, 1, 4096);
    const std::vector<int64_t> mlp_only = layer_list(c, "mlp_only_layers", n_layers);
    for (int64_t l = 0; l < n_layers; ++l) {
      const bool dense = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
      moe_layer.push_back(!dense && n_experts > 0 && (l + 1) % sparse_step == 0);
    }
    const bool any_moe = std::count(moe_layer.begin(), moe_layer.end(), true) > 0;
    n_experts_per_tok = any_moe ? c.get_int("num_experts_per_tok", 1, n_experts) : 0;
    moe_intermediate_size = any_moe ? c.get_int("moe_intermediate_size", 1, 1 << 20) : 0;
    norm_topk_prob = c.get_bool_or("norm_topk_prob", false);
    attention_bias = c.get_bool_or("attention_bias", false);
    // transformers: with use_sliding_window every layer slides over sliding_window keys.
    window = c.get_bool_or("use_sliding_window", false) ? int(window_field(c, "sliding_window", 4096)) : 0;
  }
};

struct MoeBlock {
  LinearWeight router;  // (n_experts, hidden_size)
  SwitchGLU experts;
};

class Qwen3Moe final : public DecoderModel {
 public:
  explicit Qwen3Moe(const ModelContext& ctx) : DecoderModel(ctx.backend, Qwen3MoeConfig(ctx.config)), cfg_(ctx.config) {
    WeightLoader wl(ctx.store, ctx.config, ctx.backend);
    load_backbone(wl, {.qkv_bias = cfg_.attention_bias, .o_bias = cfg_.attention_bias, .qk_norm = true},
                  std::vector<int>(size_t(cfg_.n_layers), cfg_.window));
    const int64_t h = cfg_.hidden_size;
    size_t ffn_total = 0, ffn_active = 0;
    int64_t n_moe = 0;
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".mlp";
      if (!cfg_.moe_layer[size_t(l)]) {
        dense_.push_back(load_gated_mlp(wl, p, h, cfg_.intermediate_size));
        moe_.emplace_back();
        ffn_total += dense_.back().bytes();
        ffn_active += dense_.back().bytes();
        continue;
      }
      MoeBlock b;
      b.router = wl.linear(p + ".gate", cfg_.n_experts, h);
      b.experts = SwitchGLU(wl.experts(p, cfg_.n_experts, h, cfg_.moe_intermediate_size), Activation::kSiLU);
      ffn_total += b.router.total_bytes() + b.experts.bytes_per_expert() * size_t(cfg_.n_experts);
      ffn_active += b.router.total_bytes() + b.experts.bytes_per_expert() * size_t(cfg_.n_experts_per_tok);
      moe_.push_back(std::move(b));
      dense_.emplace_back();
      ++n_moe;
    }
    wl.check_all_used();
    fill_info(ctx.config, n_moe, ffn_total, ffn_active);
  }

 protected:
  // Every output below is fully written by its op, hence scratch (no memset).
  Tensor feed_forward(Backend& be, size_t l, const Tensor& xn) const override {
    if (!cfg_.moe_layer[l]) return dense_[l].forward(be, xn);
    const MoeBlock& b = moe_[l];
    const int64_t n = xn.dim(0);
    Tensor logits = be.scratch(DType::kF32, {n, cfg_.n_experts});
    Tensor idx = be.scratch(DType::kI32, {n, cfg_.n_experts_per_tok});
    Tensor w = be.scratch(DType::kF32, {n, cfg_.n_experts_per_tok});
    be.linear(b.router, xn, logits);
    be.router_topk(logits, RouterScoring::kSoftmax, int(cfg_.n_experts_per_tok), cfg_.norm_topk_prob, idx, w);
    return b.experts.forward(be, xn, idx, w);
  }

 private:
  Qwen3MoeConfig cfg_;
  std::vector<MoeBlock> moe_;    // per layer (empty for dense layers)
  std::vector<GatedMlp> dense_;  // per layer (empty for MoE layers)
};

std::unique_ptr<Model> load_qwen3_moe(const ModelContext& ctx) {
  return std::make_unique<Qwen3Moe>(ctx);
}

// Random checkpoints of Qwen3-MoE shape: "tiny" for tests (head_dim 64 with hidden 128 and 4 heads, GQA 4/2), and
// "qwen3-30b-a3b" with the real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec qwen3_moe_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  s.config = {{"model_type", "qwen3_moe"},    {"architectures", {"Qwen3MoeForCausalLM"}},
              {"hidden_act", "silu"},         {"norm_topk_prob", true},
              {"decoder_sparse_step", 1},     {"mlp_only_layers", nlohmann::json::array()},
              {"attention_bias", false},      {"use_sliding_window", false},
              {"tie_word_embeddings", false}, {"bos_token_id", nullptr}};
  float std = 0.02f;
  if (preset == "tiny") {
    s.config.update({{"vocab_size", 512},
                     {"hidden_size", 128},
                     {"head_dim", 64},
                     {"intermediate_size", 256},
                     {"moe_intermediate_size", 64},
                     {"num_hidden_layers", 2},
                     {"num_attention_heads", 4},
                     {"num_key_value_heads", 2},
                     {"num_experts", 8},
                     {"num_experts_per_tok", 2},
                     {"max_position_embeddings", 512},
                     {"rms_norm_eps", 1e-6},
                     {"rope_theta", 10000.0},
                     {"eos_token_id", 511}});
    std = 0.08f;
  } else if (preset == "qwen3-30b-a3b") {
    s.config.update({{"vocab_size", 151936},
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
                     {"eos_token_id", 151645}});
  } else {
    fail("unknown qwen3_moe preset '{}': expected tiny or qwen3-30b-a3b", preset);
  }
  s.config.update(overrides);
  const Qwen3MoeConfig c(ModelConfig::from_json(s.config, "test model config"));
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
    if (!c.moe_layer[size_t(l)]) {
      s.tensors.push_back({m + "gate_proj", {c.intermediate_size, h}, true, std});
      s.tensors.push_back({m + "up_proj", {c.intermediate_size, h}, true, std});
      s.tensors.push_back({m + "down_proj", {h, c.intermediate_size}, true, std});
      continue;
    }
    const int64_t e = c.n_experts, f = c.moe_intermediate_size;
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

const Architecture& qwen3_moe_architecture() {
  static const Architecture arch{"qwen3_moe", &load_qwen3_moe, &qwen3_moe_test_model, {"tiny", "qwen3-30b-a3b"}};
  return arch;
}

}  // namespace moecel
