// The shared decoder skeleton: config fields, weight binding of the attention backbone, and the forward pass
// that calls each family's feed-forward block. Semantics follow transformers' Llama-style decoders
// (modeling_olmoe.py, modeling_qwen2_moe.py, modeling_qwen3_moe.py, modeling_mixtral.py, modeling_dots1.py).
#include "models/decoder.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace moecel {

DecoderConfig::DecoderConfig(const ModelConfig& c, double default_eps, double default_theta,
                             int64_t default_max_positions) {
  vocab_size = c.get_int("vocab_size", 1, 1 << 24);
  hidden_size = c.get_int("hidden_size", 1, 1 << 20);
  n_layers = c.get_int("num_hidden_layers", 1, 4096);
  n_heads = c.get_int("num_attention_heads", 1, 4096);
  n_kv_heads = c.get_int_or("num_key_value_heads", n_heads, 1, n_heads);
  MOECEL_CHECK(n_heads % n_kv_heads == 0, "{}: num_attention_heads {} is not a multiple of num_key_value_heads {}",
               c.source(), n_heads, n_kv_heads);
  if (c.has("head_dim")) {
    head_dim = c.get_int("head_dim", 1, 1 << 16);
  } else {
    MOECEL_CHECK(hidden_size % n_heads == 0,
                 "{}: hidden_size {} is not divisible by num_attention_heads {} (and no head_dim is given)", c.source(),
                 hidden_size, n_heads);
    head_dim = hidden_size / n_heads;
  }
  MOECEL_CHECK(head_dim % 2 == 0, "{}: head dimension {} must be even for rotary embeddings", c.source(), head_dim);
  max_position_embeddings = c.get_int_or("max_position_embeddings", default_max_positions, 1, int64_t(1) << 24);
  rms_norm_eps = c.get_float_or("rms_norm_eps", default_eps);
  rope_theta = c.rope_theta(default_theta);
  const std::string rope = c.rope_type();
  MOECEL_CHECK(rope == "default", "{}: rope type '{}' is not supported (only the default rotary embedding)", c.source(),
               rope);
  tie_word_embeddings = c.get_bool_or("tie_word_embeddings", false);
  check_silu_activation(c);
}

DecoderTensorShape DecoderConfig::test_shape(const AttentionOptions& opt) const {
  DecoderTensorShape d{vocab_size, hidden_size, n_layers, n_heads * head_dim, n_kv_heads * head_dim};
  if (opt.qk_norm) d.q_norm = d.k_norm = head_dim;
  if (opt.qk_norm_full) {
    d.q_norm = n_heads * head_dim;
    d.k_norm = n_kv_heads * head_dim;
  }
  d.qkv_bias = opt.qkv_bias;
  d.o_bias = opt.o_bias;
  return d;
}

Tensor GatedMlp::forward(Backend& be, const Tensor& x) const {
  const int64_t n = x.dim(0);
  Tensor g = be.scratch(DType::kF32, {n, gate.out});
  Tensor u = be.scratch(DType::kF32, {n, up.out});
  be.linear(gate, x, g);
  be.linear(up, x, u);
  be.glu(Activation::kSiLU, g, u, g);  // (n_tokens, ffn)
  Tensor y = be.scratch(DType::kF32, {n, down.out});
  be.linear(down, g, y);
  return y;
}

GatedMlp load_gated_mlp(WeightLoader& wl, const std::string& prefix, int64_t hidden, int64_t ffn) {
  GatedMlp m;
  m.gate = wl.linear(prefix + ".gate_proj", ffn, hidden);
  m.up = wl.linear(prefix + ".up_proj", ffn, hidden);
  m.down = wl.linear(prefix + ".down_proj", hidden, ffn);
  return m;
}

std::vector<int64_t> layer_list(const ModelConfig& c, const std::string& key, int64_t n_layers) {
  std::vector<int64_t> out;
  if (!c.has(key)) return out;
  const nlohmann::json& v = c.json()[key];
  MOECEL_CHECK(v.is_array(), "{}: field '{}' must be a list of layer indices", c.source(), key);
  for (const auto& e : v) {
    MOECEL_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < n_layers,
                 "{}: field '{}' must hold layer indices in [0, {}), got {}", c.source(), key, n_layers, e.dump());
    out.push_back(e.get<int64_t>());
  }
  return out;
}

std::vector<bool> sliding_layer_types(const ModelConfig& c, int64_t n_layers) {
  std::vector<bool> out;
  if (!c.has("layer_types")) return out;
  const nlohmann::json& v = c.json()["layer_types"];
  MOECEL_CHECK(v.is_array() && int64_t(v.size()) == n_layers, "{}: field 'layer_types' must list {} layer types",
               c.source(), n_layers);
  for (const auto& e : v) {
    const std::string t = e.is_string() ? e.get<std::string>() : e.dump();
    MOECEL_CHECK(t == "sliding_attention" || t == "full_attention",
                 "{}: layer type '{}' is not supported (expected sliding_attention or full_attention)", c.source(), t);
    out.push_back(t == "sliding_attention");
  }
  return out;
}

int64_t window_field(const ModelConfig& c, const std::string& key, int64_t def) {
  if (!c.json().contains(key)) return def;
  if (c.json()[key].is_null()) return 0;
  return c.get_int(key, 0, int64_t(1) << 31);
}

std::string field_alias(const ModelConfig& c, std::initializer_list<const char*> keys) {
  for (const char* k : keys) {
    if (c.has(k)) return k;
  }
  return *keys.begin();
}

void check_silu_activation(const ModelConfig& c) {
  const std::string act = c.has("hidden_act") ? c.get_string("hidden_act") : "silu";
  MOECEL_CHECK(act == "silu", "{}: hidden_act '{}' is not supported for {} (expected silu)", c.source(), act,
               c.model_type());
}

std::vector<int32_t> read_eos_ids(const ModelConfig& c) {
  std::vector<int32_t> out;
  if (!c.has("eos_token_id")) return out;
  const auto& e = c.json()["eos_token_id"];
  if (e.is_number_integer()) {
    out.push_back(e.get<int32_t>());
  } else if (e.is_array()) {
    for (const auto& v : e) {
      MOECEL_CHECK(v.is_number_integer(), "{}: field 'eos_token_id' must hold integers", c.source());
      out.push_back(v.get<int32_t>());
    }
  } else {
    fail("{}: field 'eos_token_id' must be an integer or a list of integers", c.source());
  }
  return out;
}

SparseStepMoeConfig::SparseStepMoeConfig(const ModelConfig& c, int64_t n_layers, const std::string& experts_key,
                                         int64_t default_experts) {
  n_experts = c.get_int_or(experts_key, default_experts, 0, 1 << 16);
  const int64_t sparse_step = c.get_int_or("decoder_sparse_step", 1, 1, 4096);
  const std::vector<int64_t> mlp_only = layer_list(c, "mlp_only_layers", n_layers);
  for (int64_t l = 0; l < n_layers; ++l) {
    const bool dense = std::find(mlp_only.begin(), mlp_only.end(), l) != mlp_only.end();
    moe_layer.push_back(!dense && n_experts > 0 && (l + 1) % sparse_step == 0);
  }
  const bool any = std::count(moe_layer.begin(), moe_layer.end(), true) > 0;
  n_experts_per_tok = any ? c.get_int("num_experts_per_tok", 1, n_experts) : 0;
  moe_intermediate_size = any ? c.get_int("moe_intermediate_size", 1, 1 << 20) : 0;
  norm_topk_prob = c.get_bool_or("norm_topk_prob", false);
}

std::vector<int> layer_windows(const ModelConfig& c, int64_t n_layers, int64_t sliding_window,
                               const std::function<bool(int64_t layer)>& default_sliding) {
  std::vector<bool> sliding = sliding_layer_types(c, n_layers);
  for (int64_t l = int64_t(sliding.size()); l < n_layers; ++l) sliding.push_back(default_sliding(l));
  std::vector<int> out;
  for (int64_t l = 0; l < n_layers; ++l) {
    MOECEL_CHECK(!sliding[size_t(l)] || sliding_window > 0,
                 "{}: layer {} uses sliding attention but sliding_window is not set (or is disabled)", c.source(), l);
    out.push_back(sliding[size_t(l)] ? int(sliding_window) : 0);
  }
  return out;
}

// Every output below is fully written by its op, hence scratch (no memset).
Tensor route_topk(Backend& be, const LinearWeight& router, const SwitchGLU& experts, const Tensor& xn,
                  RouterScoring scoring, int64_t k, bool renormalize) {
  const int64_t n = xn.dim(0);
  Tensor logits = be.scratch(DType::kF32, {n, router.out});
  Tensor idx = be.scratch(DType::kI32, {n, k}), w = be.scratch(DType::kF32, {n, k});
  be.linear(router, xn, logits);
  be.router_topk(logits, scoring, int(k), renormalize, idx, w);
  return experts.forward(be, xn, idx, w);
}

void routed_feed_forward_add(Backend& be, const LinearWeight& router, const SwitchGLU& experts, RouterScoring scoring,
                             int64_t k, bool renormalize, const Tensor& post_norm, float eps, Tensor& x, Tensor& xn) {
  const int64_t n = x.dim(0);
  Tensor logits = be.scratch(DType::kF32, {n, router.out});
  Tensor idx = be.scratch(DType::kI32, {n, k}), w = be.scratch(DType::kF32, {n, k});
  be.rms_norm_router(x, post_norm, eps, router, scoring, int(k), renormalize, xn, logits, idx, w);
  experts.forward_add(be, xn, idx, w, x);
}

Tensor DecoderModel::feed_forward(Backend& be, size_t layer, const Tensor& xn) const {
  const std::optional<RoutedFfn> r = routed_ffn(layer);
  MOECEL_CHECK(r.has_value(), "layer {}: the model defines neither feed_forward nor routed_ffn for it", layer);
  return route_topk(be, *r->router, *r->experts, xn, r->scoring, r->k, r->renormalize);
}

void DecoderModel::feed_forward_add(Backend& be, size_t layer, const Tensor& post_norm, float eps, Tensor& x,
                                    Tensor& xn) const {
  if (const std::optional<RoutedFfn> r = routed_ffn(layer)) {
    return routed_feed_forward_add(be, *r->router, *r->experts, r->scoring, r->k, r->renormalize, post_norm, eps, x,
                                   xn);
  }
  be.rms_norm(x, post_norm, eps, xn);
  const Tensor f = feed_forward(be, layer, xn);
  be.add(x, f, x);
}

void DecoderModel::load_backbone(WeightLoader& wl, const AttentionOptions& opt, const std::vector<int>& windows) {
  opt_ = opt;
  const int64_t h = dc_.hidden_size, qw = dc_.n_heads * dc_.head_dim, kw = dc_.n_kv_heads * dc_.head_dim;
  MOECEL_CHECK(int64_t(windows.size()) == dc_.n_layers, "decoder: {} layer windows for {} layers", windows.size(),
               dc_.n_layers);
  embed_ = wl.linear("model.embed_tokens", dc_.vocab_size, h);
  layers_.clear();
  for (int64_t l = 0; l < dc_.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    const std::string a = p + ".self_attn.";
    Layer ly;
    ly.input_norm = wl.vector(p + ".input_layernorm.weight", h);
    ly.post_norm = wl.vector(p + ".post_attention_layernorm.weight", h);
    ly.q_proj = wl.linear(a + "q_proj", qw, h);
    ly.k_proj = wl.linear(a + "k_proj", kw, h);
    ly.v_proj = wl.linear(a + "v_proj", kw, h);
    ly.o_proj = wl.linear(a + "o_proj", h, qw);
    if (opt.qkv_bias) {
      ly.q_bias = wl.vector(a + "q_proj.bias", qw);
      ly.k_bias = wl.vector(a + "k_proj.bias", kw);
      ly.v_bias = wl.vector(a + "v_proj.bias", kw);
    }
    if (opt.o_bias) ly.o_bias = wl.vector(a + "o_proj.bias", h);
    if (opt.qk_norm || opt.qk_norm_full) {
      ly.q_norm = wl.vector(a + "q_norm.weight", opt.qk_norm_full ? qw : dc_.head_dim);
      ly.k_norm = wl.vector(a + "k_norm.weight", opt.qk_norm_full ? kw : dc_.head_dim);
    }
    ly.window = windows[size_t(l)];
    layers_.push_back(std::move(ly));
  }
  final_norm_ = wl.vector("model.norm.weight", h);
  lm_head_ = dc_.tie_word_embeddings && !wl.has("lm_head.weight") ? embed_ : wl.linear("lm_head", dc_.vocab_size, h);
}

Tensor DecoderModel::forward(std::span<const int32_t> ids, KvCache& cache, bool all_logits) {
  Backend& be = *backend_;
  const int64_t n = int64_t(ids.size());
  MOECEL_CHECK(n >= 1, "forward needs at least one token");
  for (int32_t id : ids) {
    MOECEL_CHECK(id >= 0 && id < dc_.vocab_size, "token id {} is outside the vocabulary [0, {})", id, dc_.vocab_size);
  }
  Tensor tok = be.scratch(DType::kI32, {n});
  be.from_host(ids.data(), tok);
  return forward_device(tok, cache, all_logits);
}

Tensor DecoderModel::forward_device(const Tensor& tok, KvCache& cache, bool all_logits) {
  Backend& be = *backend_;
  const Tensor x = hidden_device(tok, cache);
  const Tensor last = all_logits ? x : x.slice_rows(x.dim(0) - 1, x.dim(0));
  // The final norm and the vocabulary projection as one op: a backend may normalize while it stages x (one launch).
  Tensor logits = be.scratch(DType::kF32, {last.dim(0), dc_.vocab_size});
  const LinearWeight* heads[] = {&lm_head_};
  Tensor* outs[] = {&logits};
  be.rms_norm_linears(last, final_norm_, float(dc_.rms_norm_eps), heads, outs, nullptr);
  return logits;
}

void DecoderModel::greedy_step_device(const Tensor& tok, KvCache& cache, Tensor& next) {
  MOECEL_CHECK(tok.numel() == 1, "a greedy decode step takes one token, got {}", tok.numel());
  Backend& be = *backend_;
  const Tensor x = hidden_device(tok, cache);  // (1, hidden_size)
  Tensor logits = be.scratch(DType::kF32, {1, dc_.vocab_size});
  be.rms_norm_linear_argmax(x, final_norm_, float(dc_.rms_norm_eps), lm_head_, logits, next);
}

// Every activation below is fully written by the op that produces it, hence scratch (no memset).
Tensor DecoderModel::hidden_device(const Tensor& tok, KvCache& cache) {
  Backend& be = *backend_;
  const int64_t n = tok.numel(), h = dc_.hidden_size, pos0 = cache.length;
  const int64_t qw = dc_.n_heads * dc_.head_dim, kw = dc_.n_kv_heads * dc_.head_dim;
  MOECEL_CHECK(n >= 1, "forward needs at least one token");
  MOECEL_CHECK(tok.dtype == DType::kI32, "forward: token ids must be I32");
  MOECEL_CHECK(pos0 + n <= cache.capacity, "context of {} tokens exceeds the KV cache capacity {}", pos0 + n,
               cache.capacity);
  Tensor x = be.scratch(DType::kF32, {n, h});  // (n_tokens, hidden_size): the residual stream
  be.embedding(embed_, tok, x);
  Tensor xn = be.scratch(DType::kF32, {n, h}), o = be.scratch(DType::kF32, {n, h});
  Tensor q = be.scratch(DType::kF32, {n, qw}), att = be.scratch(DType::kF32, {n, qw});
  Tensor k = be.scratch(DType::kF32, {n, kw}), v = be.scratch(DType::kF32, {n, kw});
  const float scale = float(1.0 / std::sqrt(double(dc_.head_dim)));
  const float eps = float(dc_.rms_norm_eps), theta = float(dc_.rope_theta);
  const int n_heads = int(dc_.n_heads), n_kv_heads = int(dc_.n_kv_heads), head_dim = int(dc_.head_dim);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& ly = layers_[l];
    // attention: x += o_proj(attn(rope(q_norm(q_proj(xn))), rope(k_norm(k_proj(xn))), v_proj(xn))),
    // xn = input_layernorm(x)
    const LinearWeight* qkv_w[] = {&ly.q_proj, &ly.k_proj, &ly.v_proj};
    Tensor* qkv[] = {&q, &k, &v};
    be.rms_norm_linears(x, ly.input_norm, eps, qkv_w, qkv, nullptr);
    if (ly.q_bias.data) {
      be.add_bias(q, ly.q_bias);
      be.add_bias(k, ly.k_bias);
      be.add_bias(v, ly.v_bias);
    }
    if (opt_.qk_norm_full && opt_.clip_qkv <= 0) {  // norms over the whole width, rope, cache store, attention
      be.qk_norm_rope_attention(q, k, v, ly.q_norm, ly.k_norm, eps, n_heads, n_kv_heads, head_dim, head_dim, theta,
                                cache.k[l], cache.v[l], pos0, scale, ly.window, att);
    } else {
      if (ly.q_norm.data) {  // rows of the norm weight's width: one per head, or the whole projection
        be.rms_norm(q, ly.q_norm, eps, q);
        be.rms_norm(k, ly.k_norm, eps, k);
      }
      if (opt_.clip_qkv > 0) {
        be.clamp(q, float(opt_.clip_qkv));
        be.clamp(k, float(opt_.clip_qkv));
        be.clamp(v, float(opt_.clip_qkv));
      }
      be.rope(q, pos0, n_heads, head_dim, head_dim, theta);
      be.rope(k, pos0, n_kv_heads, head_dim, head_dim, theta);
      be.kv_store(k, v, cache.k[l], cache.v[l], pos0);
      be.attention(q, cache.k[l], cache.v[l], pos0, n_heads, n_kv_heads, head_dim, scale, ly.window, att);
    }
    const std::optional<RoutedFfn> routed = ly.o_bias.data ? std::nullopt : routed_ffn(l);
    if (routed) {  // o projection, post-attention norm, router and experts (one op on the fused path)
      Tensor idx = be.scratch(DType::kI32, {n, routed->k}), w = be.scratch(DType::kF32, {n, routed->k});
      routed->experts->forward_add_routed(be, ly.o_proj, att, x, ly.post_norm, eps, *routed->router, routed->scoring,
                                          int(routed->k), routed->renormalize, xn, idx, w);
      continue;
    }
    if (ly.o_bias.data) {
      be.linear(ly.o_proj, att, o);
      be.add_bias(o, ly.o_bias);
      be.add(x, o, x);
    } else {
      be.linear_residual(ly.o_proj, att, x);
    }
    // feed-forward: x += ffn(post_attention_layernorm(x))
    feed_forward_add(be, l, ly.post_norm, eps, x, xn);
  }
  cache.length = pos0 + n;
  return x;
}

size_t DecoderModel::attention_bytes(const Layer& ly) const {
  size_t b = ly.q_proj.total_bytes() + ly.k_proj.total_bytes() + ly.v_proj.total_bytes() + ly.o_proj.total_bytes();
  for (const Tensor* t : {&ly.q_bias, &ly.k_bias, &ly.v_bias, &ly.o_bias, &ly.q_norm, &ly.k_norm}) {
    if (t->data) b += t->nbytes();
  }
  return b + ly.input_norm.nbytes() + ly.post_norm.nbytes();
}

void DecoderModel::fill_info(const ModelConfig& c, int64_t n_moe_layers, size_t ffn_total, size_t ffn_active) {
  info_.model_type = c.model_type();
  info_.vocab_size = dc_.vocab_size;
  info_.hidden_size = dc_.hidden_size;
  info_.n_layers = dc_.n_layers;
  info_.n_moe_layers = n_moe_layers;
  info_.n_kv_heads = dc_.n_kv_heads;
  info_.head_dim = dc_.head_dim;
  info_.max_position_embeddings = dc_.max_position_embeddings;
  info_.eos_token_ids = read_eos_ids(c);
  const bool tied = lm_head_.weight.data == embed_.weight.data;
  size_t total = embed_.total_bytes() + (tied ? 0 : lm_head_.total_bytes()) + final_norm_.nbytes() + ffn_total;
  // lm_head + one embedding row (approx.) + the final norm
  size_t active = lm_head_.total_bytes() + size_t(dc_.hidden_size) * 4 + final_norm_.nbytes() + ffn_active;
  for (const Layer& ly : layers_) {
    total += attention_bytes(ly);
    active += attention_bytes(ly);
  }
  info_.weight_bytes = total;
  info_.active_bytes_per_token = active;
}

}  // namespace moecel
