// Binding a checkpoint's tensors to a model: linear layers (dense or MLX-quantized), norms, and stacked
// experts from any of the three expert layouts. Every tensor is checked against the shape the config implies.
// Used by every architecture file.
#pragma once
#include <string>

#include "backend/backend.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "quant/qweight.h"

namespace moecel {

// Names of one expert's three projections in a family's checkpoints.
struct ExpertNames {
  std::string gate = "gate_proj", up = "up_proj", down = "down_proj";
};

struct SwitchWeights {
  LinearWeight gate, up, down;  // (n_experts, ffn, hidden), (n_experts, ffn, hidden), (n_experts, hidden, ffn)
};

class WeightLoader {
 public:
  WeightLoader(const WeightStore& store, const ModelConfig& config, Backend& backend)
      : store_(store), config_(config), backend_(backend) {}

  // A linear layer `prefix` (e.g. "model.layers.0.self_attn.q_proj") of logical shape (out, in), on the backend.
  LinearWeight linear(const std::string& prefix, int64_t out, int64_t in);
  // A 1-D float tensor (norm weight) of length d, on the backend.
  Tensor vector(const std::string& name, int64_t d);
  bool has(const std::string& name) const { return store_.has(name); }

  // Experts of one MoE block `mlp_prefix` (e.g. "model.layers.3.mlp"), found in one of these layouts:
  //  - stacked (mlx-community): {mlp_prefix}.{stacked}.{gate,up,down}.* with a leading n_experts axis
  //  - per expert (HF): {mlp_prefix}.experts.E.{gate,up,down}.weight, stacked here
  //  - fused (recent transformers): {mlp_prefix}.experts.gate_up_proj (n_experts, 2 * ffn, hidden), gate rows
  //    first, and {mlp_prefix}.experts.down_proj (n_experts, hidden, ffn)
  SwitchWeights experts(const std::string& mlp_prefix, int64_t n_experts, int64_t hidden, int64_t ffn,
                        const ExpertNames& names = {}, const std::string& stacked = "switch_mlp");

  // Throws naming the first checkpoint tensor that no layer claimed.
  void check_all_used() const;

 private:
  LinearWeight load(const std::string& prefix, Shape logical, bool stacked);
  const WeightStore& store_;
  const ModelConfig& config_;
  Backend& backend_;
};

}  // namespace moecel
