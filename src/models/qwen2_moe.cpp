// Qwen2-MoE (model_type "qwen2_moe", Qwen/Qwen1.5-MoE-A2.7B): the shared decoder with q/k/v biases and GQA; MoE
// layers route a softmax top-k (renormalized only with norm_topk_prob) over SwiGLU experts and add a shared expert
// scaled by sigmoid(shared_expert_gate(x)); decoder_sparse_step / mlp_only_layers make some layers dense.
// Semantics follow transformers' modeling_qwen2_moe.py; weights bind by the checkpoint's names (mlx-community
// `mlp.switch_mlp.*`, HF per-expert `mlp.experts.E.*` or fused `mlp.experts.gate_up_proj`).
#include <algorithm>

#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/switch_glu.h"

namespace moecel {
namespace {

struct Qwen2MoeConfig : DecoderConfig {
  int64_t intermediate_size, moe_intermediate_size, shared_expert_intermediate_size;
  int64_t n_experts, n_experts_per_tok;
  bool norm_topk_prob, qkv_bias;
  std::vector<bool> moe_layer;  // per layer: sparse MoE block (else a dense MLP)
  std::vector<int> window;      // per layer: sliding window (0: full causal)

  explicit Qwen2MoeConfig(const ModelConfig& c) : DecoderConfig(c, 1e-6, 10000.0, 32768) {
    intermediate_size = c.get_int_or("intermediate_size", 5632, 1, 1 << 20);
    n_experts = c.get_int_or("num_experts", 60, 0, 1 << 16);
    const int64_t sparse_step = c.get_int_or("decoder_sparse_step", 1, 1, 4096);
    const std::vector<int64_t> mlp_only = layer_list(c, "mlp_only_layers", n_layers);
    for (int64_t l = 0; l < n_layers; ++l) {
      const bool dense = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
      moe_layer.push_back(!dense && n_experts > 0 && (l + 1) % sparse_step == 0);
    }
    const bool any_moe = std::count(moe_layer.begin(), moe_layer.end(), true) > 0;
    n_experts_per_tok = any_moe ? c.get_int("num_experts_per_tok", 1, n_experts) : 0;
    moe_intermediate_size = any_moe ? c.get_int("moe_intermediate_size", 1, 1 << 20) : 0;
    shared_expert_intermediate_size = any_moe ? c.get_int("shared_expert_intermediate_size", 1, 1 << 20) : 0;
    norm_topk_prob = c.get_bool_or("norm_topk_prob", false);
    qkv_bias = c.get_bool_or("qkv_bias", true);
    // transformers: sliding_window only counts with use_sliding_window; by default the even layers below
    // max_window_layers slide (configuration_qwen2_moe.py), unless layer_types says otherwise.
    const bool use_sliding = c.get_bool_or("use_sliding_window", false);
    const int64_t sliding_window = use_sliding ? window_field(c, "sliding_window", 4096) : 0;
    const int64_t max_window_layers = c.get_int_or("max_window_layers", 28, 0, 1 << 20);
    std::vector<bool> sliding = sliding_layer_types(c, n_layers);
    for (int64_t l = 0; l < n_layers && sliding.size() < size_t(n_layers); ++l) {
      sliding.push_back((l + 1) % 2 == 1 && l < max_window_layers && use_sliding);
    }
    for (int64_t l = 0; l < n_layers; ++l) {
      MOECEL_CHECK(!sliding[size_t(l)] || sliding_window > 0,
                   "{}: layer {} uses sliding attention but sliding_window is not set (or use_sliding_window is false)",
                   c.source(), l);
      window.push_back(sliding[size_t(l)] ? int(sliding_window) : 0);
    }
  }
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
    load_backbone(wl, {.qkv_bias = cfg_.qkv_bias}, cfg_.window);
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
      b.shared = load_gated_mlp(wl, p + ".shared_expert", h, cfg_.shared_expert_intermediate_size);
      b.shared_gate = wl.linear(p + ".shared_expert_gate", 1, h);
      const size_t common = b.router.total_bytes() + b.shared.bytes() + b.shared_gate.total_bytes();
      ffn_total += common + b.experts.bytes_per_expert() * size_t(cfg_.n_experts);
      ffn_active += common + b.experts.bytes_per_expert() * size_t(cfg_.n_experts_per_tok);
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
    Tensor y = b.experts.forward(be, xn, idx, w);  // (n_tokens, hidden_size)
    Tensor shared = b.shared.forward(be, xn);
    Tensor gate = be.scratch(DType::kF32, {n, 1});
    be.linear(b.shared_gate, xn, gate);
    be.add_sigmoid_gated(y, gate, shared, y);  // y + sigmoid(shared_expert_gate(x)) * shared_expert(x)
    return y;
  }

 private:
  Qwen2MoeConfig cfg_;
  std::vector<MoeBlock> moe_;    // per layer (empty for dense layers)
  std::vector<GatedMlp> dense_;  // per layer (empty for MoE layers)
};

std::unique_ptr<Model> load_qwen2_moe(const ModelContext& ctx) {
  return std::make_unique<Qwen2Moe>(ctx);
}

// Random checkpoints of Qwen2-MoE shape: "tiny" for tests (layer 1 dense through mlp_only_layers), and
// "qwen1.5-moe-a2.7b" with the real shapes for benchmarks. `overrides` replace config.json fields.
TestModelSpec qwen2_moe_test_model(const std::string& preset, const nlohmann::json& overrides) {
  TestModelSpec s;
  s.config = {{"model_type", "qwen2_moe"},    {"architectures", {"Qwen2MoeForCausalLM"}},
              {"hidden_act", "silu"},         {"norm_topk_prob", false},
              {"decoder_sparse_step", 1},     {"use_sliding_window", false},
              {"tie_word_embeddings", false}, {"bos_token_id", nullptr}};
  float std = 0.02f;
  if (preset == "tiny") {
    s.config.update({{"vocab_size", 512},
                     {"hidden_size", 128},
                     {"intermediate_size", 256},
                     {"moe_intermediate_size", 64},
                     {"shared_expert_intermediate_size", 128},
                     {"num_hidden_layers", 3},
                     {"mlp_only_layers", {1}},
                     {"num_attention_heads", 4},
                     {"num_key_value_heads", 2},
                     {"num_experts", 8},
                     {"num_experts_per_tok", 2},
                     {"max_position_embeddings", 512},
                     {"rms_norm_eps", 1e-6},
                     {"rope_theta", 10000.0},
                     {"eos_token_id", 511}});
    std = 0.08f;
  } else if (preset == "qwen1.5-moe-a2.7b") {
    s.config.update({{"vocab_size", 151936},
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
                     {"eos_token_id", 151643}});
  } else {
    fail("unknown qwen2_moe preset '{}': expected tiny or qwen1.5-moe-a2.7b", preset);
  }
  s.config.update(overrides);
  const Qwen2MoeConfig c(ModelConfig::from_json(s.config, "test model config"));
  const int64_t h = c.hidden_size, qw = c.n_heads * c.head_dim, kw = c.n_kv_heads * c.head_dim;
  s.tensors.push_back({"model.embed_tokens", {c.vocab_size, h}, true, 1.0f});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l), a = p + ".self_attn.", m = p + ".mlp.";
    s.tensors.push_back({p + ".input_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({p + ".post_attention_layernorm.weight", {h}, false, 0.1f});
    s.tensors.push_back({a + "q_proj", {qw, h}, true, std});
    s.tensors.push_back({a + "k_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "v_proj", {kw, h}, true, std});
    s.tensors.push_back({a + "o_proj", {h, qw}, true, std});
    if (c.qkv_bias) {
      s.tensors.push_back({a + "q_proj.bias", {qw}, false, 0.1f});
      s.tensors.push_back({a + "k_proj.bias", {kw}, false, 0.1f});
      s.tensors.push_back({a + "v_proj.bias", {kw}, false, 0.1f});
    }
    auto mlp = [&](const std::string& q, int64_t f) {
      s.tensors.push_back({q + "gate_proj", {f, h}, true, std});
      s.tensors.push_back({q + "up_proj", {f, h}, true, std});
      s.tensors.push_back({q + "down_proj", {h, f}, true, std});
    };
    if (!c.moe_layer[size_t(l)]) {
      mlp(m, c.intermediate_size);
      continue;
    }
    const int64_t e = c.n_experts, f = c.moe_intermediate_size;
    s.tensors.push_back({m + "gate", {e, h}, true, std * 4});
    s.tensors.push_back({m + "switch_mlp.gate_proj", {e, f, h}, true, std});
    s.tensors.push_back({m + "switch_mlp.up_proj", {e, f, h}, true, std});
    s.tensors.push_back({m + "switch_mlp.down_proj", {e, h, f}, true, std});
    mlp(m + "shared_expert.", c.shared_expert_intermediate_size);
    s.tensors.push_back({m + "shared_expert_gate", {1, h}, true, std});
  }
  s.tensors.push_back({"model.norm.weight", {h}, false, 0.1f});
  s.tensors.push_back({"lm_head", {c.vocab_size, h}, true, std});
  return s;
}

}  // namespace

const Architecture& qwen2_moe_architecture() {
  static const Architecture arch{"qwen2_moe", &load_qwen2_moe, &qwen2_moe_test_model, {"tiny", "qwen1.5-moe-a2.7b"}};
  return arch;
}

}  // namespace moecel
