// OLMoE (model_type "olmoe", allenai/OLMoE-1B-7B): pre-norm decoder with full-width q/k RMSNorm, NeoX rotary,
// and a softmax top-k MoE of SwiGLU experts with no shared expert. Semantics follow transformers'
// modeling_olmoe.py; weights are bound by the checkpoint's own names (mlx-community or HF layout).
#include <cmath>

#include "core/error.h"
#include "models/decoder.h"
#include "models/registry.h"
#include "models/switch_glu.h"
#include "models/test_model.h"
#include "models/weights.h"

namespace moecel {
namespace {

struct OlmoeConfig {
  int64_t vocab_size, hidden_size, intermediate_size, n_layers, n_heads, n_kv_heads, head_dim;
  int64_t n_experts, n_experts_per_tok, max_position_embeddings;
  double rms_norm_eps, rope_theta, clip_qkv;
  bool norm_topk_prob, tie_word_embeddings;

  explicit OlmoeConfig(const ModelConfig& c) {
    vocab_size = c.get_int("vocab_size", 1, 1 << 24);
    hidden_size = c.get_int("hidden_size", 1, 1 << 20);
    intermediate_size = c.get_int("intermediate_size", 1, 1 << 20);
    n_layers = c.get_int("num_hidden_layers", 1, 4096);
    n_heads = c.get_int("num_attention_heads", 1, 4096);
    n_kv_heads = c.get_int_or("num_key_value_heads", n_heads, 1, n_heads);
    MOECEL_CHECK(hidden_size % n_heads == 0, "{}: hidden_size {} is not divisible by num_attention_heads {}",
                 c.source(), hidden_size, n_heads);
    MOECEL_CHECK(n_heads % n_kv_heads == 0, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
                 c.source(), n_heads, n_kv_heads);
    head_dim = hidden_size / n_heads;
    MOECEL_CHECK(head_dim % 2 == 0, "{}: head dimension {} must be even for rotary embeddings", c.source(), head_dim);
    n_experts = c.get_int("num_experts", 1, 1 << 16);
    n_experts_per_tok = c.get_int("num_experts_per_tok", 1, n_experts);
    max_position_embeddings = c.get_int_or("max_position_embeddings", 4096, 1, int64_t(1) << 24);
    rms_norm_eps = c.get_float_or("rms_norm_eps", 1e-5);
    rope_theta = c.rope_theta(10000.0);
    clip_qkv = c.get_float_or("clip_qkv", 0.0);
    norm_topk_prob = c.get_bool_or("norm_topk_prob", false);
    tie_word_embeddings = c.get_bool_or("tie_word_embeddings", false);
    MOECEL_CHECK(!c.get_bool_or("attention_bias", false), "{}: attention_bias true is not supported for olmoe",
                 c.source());
  }
};

struct Layer {
  Tensor input_norm, post_norm, q_norm, k_norm;  // (hidden_size,), q/k norms over the full projection width
  LinearWeight q_proj, k_proj, v_proj, o_proj;
  LinearWeight router;  // (n_experts, hidden_size)
  SwitchGLU experts;
};

class Olmoe final : public Model {
 public:
  Olmoe(const ModelContext& ctx) : Model(ctx.backend), cfg_(ctx.config) {
    WeightLoader wl(ctx.store, ctx.config, ctx.backend);
    const int64_t h = cfg_.hidden_size, kv = cfg_.n_kv_heads * cfg_.head_dim;
    embed_ = wl.linear("model.embed_tokens", cfg_.vocab_size, h);
    for (int64_t l = 0; l < cfg_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l);
      Layer ly;
      ly.input_norm = wl.vector(p + ".input_layernorm.weight", h);
      ly.post_norm = wl.vector(p + ".post_attention_layernorm.weight", h);
      ly.q_proj = wl.linear(p + ".self_attn.q_proj", h, h);
      ly.k_proj = wl.linear(p + ".self_attn.k_proj", kv, h);
      ly.v_proj = wl.linear(p + ".self_attn.v_proj", kv, h);
      ly.o_proj = wl.linear(p + ".self_attn.o_proj", h, h);
      ly.q_norm = wl.vector(p + ".self_attn.q_norm.weight", h);
      ly.k_norm = wl.vector(p + ".self_attn.k_norm.weight", kv);
      ly.router = wl.linear(p + ".mlp.gate", cfg_.n_experts, h);
      ly.experts = SwitchGLU(wl.experts(p + ".mlp", cfg_.n_experts, h, cfg_.intermediate_size), Activation::kSiLU);
      layers_.push_back(std::move(ly));
    }
    final_norm_ = wl.vector("model.norm.weight", h);
    lm_head_ =
        cfg_.tie_word_embeddings && !wl.has("lm_head.weight") ? embed_ : wl.linear("lm_head", cfg_.vocab_size, h);
    wl.check_all_used();
    fill_info(ctx.config);
  }

  Tensor forward(std::span<const int32_t> ids, KvCache& cache, bool all_logits) override {
    Backend& be = *backend_;
    const int64_t n = int64_t(ids.size());
    MOECEL_CHECK(n >= 1, "forward needs at least one token");
    for (int32_t id : ids) {
      MOECEL_CHECK(id >= 0 && id < cfg_.vocab_size, "token id {} is outside the vocabulary [0, {})", id,
                   cfg_.vocab_size);
    }
    Tensor tok = be.scratch(DType::kI32, {n});
    be.from_host(ids.data(), tok);
    return forward_device(tok, cache, all_logits);
  }

  bool has_device_forward() const override { return true; }

  // Every activation below is fully written by the op that produces it, hence scratch (no memset).
  Tensor forward_device(const Tensor& tok, KvCache& cache, bool all_logits) override {
    Backend& be = *backend_;
    const int64_t n = tok.numel(), h = cfg_.hidden_size;
    const int64_t kv = cfg_.n_kv_heads * cfg_.head_dim, pos0 = cache.length;
    MOECEL_CHECK(n >= 1, "forward needs at least one token");
    MOECEL_CHECK(tok.dtype == DType::kI32, "forward: token ids must be I32");
    MOECEL_CHECK(pos0 + n <= cache.capacity, "context of {} tokens exceeds the KV cache capacity {}", pos0 + n,
                 cache.capacity);
    Tensor x = be.scratch(DType::kF32, {n, h});  // (n_tokens, hidden_size): the residual stream
    be.embedding(embed_, tok, x);

    Tensor xn = be.scratch(DType::kF32, {n, h});
    Tensor q = be.scratch(DType::kF32, {n, h}), k = be.scratch(DType::kF32, {n, kv});
    Tensor v = be.scratch(DType::kF32, {n, kv});
    Tensor att = be.scratch(DType::kF32, {n, h});
    Tensor router_logits = be.scratch(DType::kF32, {n, cfg_.n_experts});
    Tensor topk_idx = be.scratch(DType::kI32, {n, cfg_.n_experts_per_tok});
    Tensor topk_w = be.scratch(DType::kF32, {n, cfg_.n_experts_per_tok});
    const float scale = float(1.0 / std::sqrt(double(cfg_.head_dim)));
    const float eps = float(cfg_.rms_norm_eps), theta = float(cfg_.rope_theta);
    const int n_heads = int(cfg_.n_heads), n_kv_heads = int(cfg_.n_kv_heads), head_dim = int(cfg_.head_dim);
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& ly = layers_[l];
      // attention: x += o_proj(attn(rope(q_norm(q_proj(xn))), rope(k_norm(k_proj(xn))), v_proj(xn))),
      // xn = input_norm(x)
      const LinearWeight* qkv_w[] = {&ly.q_proj, &ly.k_proj, &ly.v_proj};
      Tensor* qkv[] = {&q, &k, &v};
      be.rms_norm_linears(x, ly.input_norm, eps, qkv_w, qkv, nullptr);
      if (cfg_.clip_qkv > 0) {
        be.rms_norm(q, ly.q_norm, eps, q);
        be.rms_norm(k, ly.k_norm, eps, k);
        be.clamp(q, float(cfg_.clip_qkv));
        be.clamp(k, float(cfg_.clip_qkv));
        be.clamp(v, float(cfg_.clip_qkv));
        be.rope(q, pos0, n_heads, head_dim, head_dim, theta);
        be.rope(k, pos0, n_kv_heads, head_dim, head_dim, theta);
        be.kv_store(k, v, cache.k[l], cache.v[l], pos0);
      } else {
        be.qk_norm_rope_store(q, k, v, ly.q_norm, ly.k_norm, eps, n_heads, n_kv_heads, head_dim, head_dim, theta,
                              cache.k[l], cache.v[l], pos0);
      }
      be.attention(q, cache.k[l], cache.v[l], pos0, n_heads, n_kv_heads, head_dim, scale, 0, att);
      be.linear_residual(ly.o_proj, att, x);
      // MoE: x += sum_k w_k * expert_k(xn), xn = post_norm(x), softmax over all experts, top-k
      be.rms_norm_router(x, ly.post_norm, eps, ly.router, RouterScoring::kSoftmax, int(cfg_.n_experts_per_tok),
                         cfg_.norm_topk_prob, xn, router_logits, topk_idx, topk_w);
      ly.experts.forward_add(be, xn, topk_idx, topk_w, x);
    }
    Tensor last = all_logits ? x : x.slice_rows(n - 1, n);
    Tensor normed = be.scratch(DType::kF32, last.shape);
    be.rms_norm(last, final_norm_, float(cfg_.rms_norm_eps), normed);
    Tensor logits = be.scratch(DType::kF32, {last.dim(0), cfg_.vocab_size});
    be.linear(lm_head_, normed, logits);
    cache.length = pos0 + n;
    return logits;
  }

 private:
  void fill_info(const ModelConfig& c) {
    info_.model_type = "olmoe";
    info_.vocab_size = cfg_.vocab_size;
    info_.hidden_size = cfg_.hidden_size;
    info_.n_layers = cfg_.n_layers;
    info_.n_moe_layers = cfg_.n_layers;
    info_.n_kv_heads = cfg_.n_kv_heads;
    info_.head_dim = cfg_.head_dim;
    info_.max_position_embeddings = cfg_.max_position_embeddings;
    info_.eos_token_ids = read_eos_ids(c);
    size_t total = embed_.total_bytes() + (lm_head_.weight.data == embed_.weight.data ? 0 : lm_head_.total_bytes());
    size_t active = lm_head_.total_bytes() + size_t(cfg_.hidden_size) * 4;  // lm_head + the embedding row (approx.)
    for (const Layer& ly : layers_) {
      size_t attn = ly.q_proj.total_bytes() + ly.k_proj.total_bytes() + ly.v_proj.total_bytes() +
                    ly.o_proj.total_bytes() + ly.router.total_bytes();
      total += attn + ly.experts.bytes_per_expert() * size_t(cfg_.n_experts);
      active += attn + ly.experts.bytes_per_expert() * size_t(cfg_.n_experts_per_tok);
    }
    info_.weight_bytes = total;
    info_.active_bytes_per_token = active;
  }

  OlmoeConfig cfg_;
  LinearWeight embed_, lm_head_;
  Tensor final_norm_;
  std::vector<Layer> layers_;
};

std::unique_ptr<Model> load_olmoe(const ModelContext& ctx) {
  return std::make_unique<Olmoe>(ctx);
}

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
  const int64_t h = c.hidden_size, kv = c.n_kv_heads * c.head_dim;
  // OLMoE's q/k norms span the whole projection, (hidden_size,) and (kv width,), not one head.
  const DecoderTensorShape shape{c.vocab_size, h, c.n_layers, h, kv, h, kv};
  add_decoder_tensors(s, shape, std, [&](int64_t, const std::string& p) {
    add_moe_tensors(s, p + "mlp.", c.n_experts, h, c.intermediate_size, std);
  });
  return s;
}

}  // namespace

const Architecture& olmoe_architecture() {
  static const Architecture arch{"olmoe", &load_olmoe, &olmoe_test_model, {"tiny", "olmoe-1b-7b"}};
  return arch;
}

}  // namespace moecel
