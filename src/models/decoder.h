// The pre-norm decoder skeleton shared by the Llama-style MoE families: embedding, per layer
// `h = x + attn(input_layernorm(x))` and `x = h + ffn(post_attention_layernorm(h))`, final norm, lm_head.
// Attention takes optional q/k/v/o biases, per-head q/k RMSNorm and a per-layer sliding window; the family file
// supplies the config, its feed-forward blocks (routed experts through SwitchGLU) and the weight names; the pieces
// below that several families read or run alike live here once. Used by: olmoe, qwen2_moe, qwen3_moe, mixtral, dots1.
#pragma once
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/config.h"
#include "models/model.h"
#include "models/registry.h"
#include "models/switch_glu.h"
#include "models/test_model.h"
#include "models/weights.h"

namespace moecel {

// Which optional attention weights a family's checkpoints carry.
struct AttentionOptions {
  bool qkv_bias = false;      // {q,k,v}_proj.bias
  bool o_bias = false;        // o_proj.bias
  bool qk_norm = false;       // self_attn.{q,k}_norm.weight (head_dim,), applied per head before rotary
  bool qk_norm_full = false;  // self_attn.{q,k}_norm.weight over the whole q / k projection width (OLMoE)
  double clip_qkv = 0.0;      // q, k, v clamped to [-clip_qkv, clip_qkv] after the norms (OLMoE); 0: none
};

// The fields every decoder family reads, by their HF names.
struct DecoderConfig {
  int64_t vocab_size, hidden_size, n_layers, n_heads, n_kv_heads, head_dim, max_position_embeddings;
  double rms_norm_eps, rope_theta;
  bool tie_word_embeddings;
  // head_dim: the explicit "head_dim" when present, else hidden_size / num_attention_heads.
  DecoderConfig(const ModelConfig& c, double default_eps, double default_theta, int64_t default_max_positions);
  // The backbone's shapes for a test-model recipe.
  DecoderTensorShape test_shape(const AttentionOptions& opt) const;
};

// A dense SwiGLU block, down(silu(gate(x)) * up(x)): dense layers and shared experts.
struct GatedMlp {
  LinearWeight gate, up, down;  // (ffn, hidden), (ffn, hidden), (hidden, ffn)
  // x (n_tokens, hidden) -> a new (n_tokens, hidden)
  Tensor forward(Backend& be, const Tensor& x) const;
  size_t bytes() const { return gate.total_bytes() + up.total_bytes() + down.total_bytes(); }
};
// {prefix}.gate_proj, {prefix}.up_proj, {prefix}.down_proj
GatedMlp load_gated_mlp(WeightLoader& wl, const std::string& prefix, int64_t hidden, int64_t ffn);

// Config helpers. A list of layer indices (e.g. "mlp_only_layers"; empty when missing or null).
std::vector<int64_t> layer_list(const ModelConfig& c, const std::string& key, int64_t n_layers);
// "layer_types" when present: true for "sliding_attention", false for "full_attention" (anything else throws).
std::vector<bool> sliding_layer_types(const ModelConfig& c, int64_t n_layers);
// A window size field where null means none (0) and a missing field means `def`.
int64_t window_field(const ModelConfig& c, const std::string& key, int64_t def);
// The first of `keys` present (not null) in the config, or `keys[0]` when none is: for fields transformers reads
// under an alias (attribute_map), e.g. {"num_experts", "num_local_experts"}.
std::string field_alias(const ModelConfig& c, std::initializer_list<const char*> keys);
// Throws unless hidden_act is silu (the only activation these families use).
void check_silu_activation(const ModelConfig& c);
std::vector<int32_t> read_eos_ids(const ModelConfig& c);

// The routed-expert fields Qwen2-MoE and Qwen3-MoE read alike. MoE layers follow transformers' rule: every
// decoder_sparse_step-th layer unless listed in mlp_only_layers, none without experts; the top-k and the expert width
// are required only when some layer is MoE (else 0).
struct SparseStepMoeConfig {
  int64_t n_experts, n_experts_per_tok, moe_intermediate_size;
  bool norm_topk_prob;
  std::vector<bool> moe_layer;  // per layer: sparse MoE block (else a dense MLP)
  // experts_key: the config field holding the expert count, `default_experts` when missing.
  SparseStepMoeConfig(const ModelConfig& c, int64_t n_layers, const std::string& experts_key, int64_t default_experts);
  bool any_moe() const { return n_experts_per_tok > 0; }
};
// Per layer sliding window (0: full causal): "layer_types" when present, else default_sliding(layer); sliding layers
// attend to the last `sliding_window` keys, which must then be > 0.
std::vector<int> layer_windows(const ModelConfig& c, int64_t n_layers, int64_t sliding_window,
                               const std::function<bool(int64_t layer)>& default_sliding);

// Router logits (n_tokens, n_experts) -> top-k expert ids and weights -> the routed experts' weighted sum, a new
// (n_tokens, hidden_size). xn: (n_tokens, hidden_size).
Tensor route_topk(Backend& be, const LinearWeight& router, const SwitchGLU& experts, const Tensor& xn,
                  RouterScoring scoring, int64_t k, bool renormalize);

// The feed-forward half of a layer whose block is a router and routed experts only: x += experts(xn, top-k of
// router(xn)) with xn = rms_norm(x, post_norm) written to `xn`, through Backend::rms_norm_router and
// SwitchGLU::forward_add (the same ops and rounding as rms_norm, route_topk and add, in fewer launches).
// x, xn (n_tokens, hidden_size).
void routed_feed_forward_add(Backend& be, const LinearWeight& router, const SwitchGLU& experts, RouterScoring scoring,
                             int64_t k, bool renormalize, const Tensor& post_norm, float eps, Tensor& x, Tensor& xn);

// A layer's feed-forward block when it is a router and routed experts only (x += experts(xn, top-k of
// router(xn)), xn = rms_norm(x, post_norm)): the decoder then runs the attention's output projection, the norm and
// the router as one op (Backend::linear_residual_norm_router).
struct RoutedFfn {
  const LinearWeight* router;
  const SwitchGLU* experts;
  RouterScoring scoring;
  int64_t k;
  bool renormalize;
};

// Per-layer feed-forward weights of a family whose layers are each a dense MLP or a MoE block (with a member
// `experts`), and the byte counts DecoderModel::fill_info takes.
template <class Block>
struct LayerFfns {
  std::vector<Block> moe;        // per layer (empty for dense layers)
  std::vector<GatedMlp> dense;   // per layer (empty for MoE layers)
  size_t total = 0, active = 0;  // bytes of every weight; bytes one decode token reads
  int64_t n_moe = 0;

  void add_dense(GatedMlp m) {
    total += m.bytes();
    active += m.bytes();
    dense.push_back(std::move(m));
    moe.emplace_back();
  }
  // always_read: bytes of the block's weights every token reads (router, shared experts).
  void add_moe(Block b, size_t always_read, int64_t n_experts, int64_t top_k) {
    total += always_read + b.experts.bytes_per_expert() * size_t(n_experts);
    active += always_read + b.experts.bytes_per_expert() * size_t(top_k);
    moe.push_back(std::move(b));
    dense.emplace_back();
    ++n_moe;
  }
};

// The registry's loader for a family's model class.
template <class M>
std::unique_ptr<Model> load_as(const ModelContext& ctx) {
  return std::make_unique<M>(ctx);
}

class DecoderModel : public Model {
 public:
  Tensor forward(std::span<const int32_t> ids, KvCache& cache, bool all_logits) override;
  bool has_device_forward() const override { return true; }
  Tensor forward_device(const Tensor& ids, KvCache& cache, bool all_logits) override;
  void greedy_step_device(const Tensor& ids, KvCache& cache, Tensor& next) override;

 protected:
  DecoderModel(Backend& backend, const DecoderConfig& dc) : Model(backend), dc_(dc) {}

  // Binds model.embed_tokens, every layer's input/post-attention norms and self_attn, model.norm and lm_head.
  // windows: per layer sliding window in keys (0: full causal attention).
  void load_backbone(WeightLoader& wl, const AttentionOptions& opt, const std::vector<int>& windows);
  // The family's feed-forward block of `layer`: xn (n_tokens, hidden_size) = post_attention_layernorm(h)
  // -> a new (n_tokens, hidden_size) tensor (never xn itself). Default: the routed_ffn(layer) block (route_topk);
  // families with other blocks override it.
  virtual Tensor feed_forward(Backend& be, size_t layer, const Tensor& xn) const;
  // The whole feed-forward half of `layer`: x += feed_forward(rms_norm(x, post_norm)), with xn (n_tokens,
  // hidden_size) as scratch for the normalized input; routed_feed_forward_add where routed_ffn(layer) is set.
  virtual void feed_forward_add(Backend& be, size_t layer, const Tensor& post_norm, float eps, Tensor& x,
                                Tensor& xn) const;
  // Layer `layer`'s block when it is routed experts only (families with such blocks override it), else none.
  virtual std::optional<RoutedFfn> routed_ffn(size_t /*layer*/) const { return std::nullopt; }
  // Fills info_. ffn_total: bytes of every feed-forward weight; ffn_active: the bytes one decode token reads.
  void fill_info(const ModelConfig& c, int64_t n_moe_layers, size_t ffn_total, size_t ffn_active);

  DecoderConfig dc_;

 private:
  AttentionOptions opt_;
  struct Layer {
    Tensor input_norm, post_norm;  // (hidden_size,)
    LinearWeight q_proj, k_proj, v_proj, o_proj;
    Tensor q_bias, k_bias, v_bias, o_bias;  // (width,) or empty
    Tensor q_norm, k_norm;                  // (head_dim,), (q / k width,) with qk_norm_full, or empty
    int window = 0;
  };
  size_t attention_bytes(const Layer& ly) const;
  // The layers of forward_device: the residual stream (n_tokens, hidden_size) after the last layer, the cache
  // advanced by the ids.
  Tensor hidden_device(const Tensor& ids, KvCache& cache);

  LinearWeight embed_, lm_head_;
  Tensor final_norm_;
  std::vector<Layer> layers_;
};

}  // namespace moecel
