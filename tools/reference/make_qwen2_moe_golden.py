"""Writes the qwen2_moe golden cases (tests/golden/qwen2_moe_*): two mlx-community checkpoints quantized by mlx-lm
(4-bit and 8-bit) and one bf16 checkpoint written by transformers, each with transformers' teacher-forced logits and
greedy ids (see family_ref_common.py for how; tools/reference/README.md for the case table).

Usage: python make_qwen2_moe_golden.py [--out tests/golden] [--case NAME ...]
"""

import family_ref_common as fam
from family_ref_common import FamilyCase


def hub_config(**over):
    """A config.json as Qwen/Qwen1.5-MoE-A2.7B carries it (transformers 4.x field set: top-level rope_theta,
    torch_dtype, no qkv_bias, which defaults to true), which mlx_lm.convert copies into mlx-community folders."""
    return fam.hub_config(
        {
            "architectures": ["Qwen2MoeForCausalLM"],
            "bos_token_id": 510,
            "decoder_sparse_step": 1,
            "intermediate_size": 256,
            "max_window_layers": 21,
            "model_type": "qwen2_moe",
            "moe_intermediate_size": 64,
            "norm_topk_prob": False,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 2,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "shared_expert_intermediate_size": 128,
            "sliding_window": 4096,
            "transformers_version": "4.40.0.dev0",
            "use_sliding_window": False,
        },
        over,
    )


CASES = [
    FamilyCase(
        name="qwen2_moe_mlx_q4",
        kind="mlx",
        config=hub_config(),
        seed=3001,
        prompt_len=24,
        desc="qwen2_moe: q/k/v biases, GQA 4/2, 8 experts top-2 without renormalization (norm_topk_prob false), "
        "shared expert (128 wide) scaled by sigmoid(shared_expert_gate(x)), every layer MoE; mlx layout "
        "model.layers.L.mlp.switch_mlp.{gate,up,down}_proj, mlp.shared_expert.*, mlp.shared_expert_gate (quantized "
        "too, a (1, hidden) linear), q/k/v_proj.bias dense",
    ),
    fam.mlx_q8_case(
        name="qwen2_moe_mlx_q8",
        config=hub_config(hidden_size=64, num_hidden_layers=3, num_key_value_heads=4, num_experts_per_tok=4,
                          shared_expert_intermediate_size=64, rope_theta=10000.0, torch_dtype="float16"),
        seed=3002,
        desc="qwen2_moe 8-bit group 32, float16: hidden 64, 3 layers, 4 heads (no GQA), 8 experts top-4, shared expert "
        "64 wide",
    ),
    FamilyCase(
        name="qwen2_moe_hf_bf16",
        kind="hf",
        config=fam.hf_config("qwen2_moe", 20000.0, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                             shared_expert_intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                             num_key_value_heads=2, num_experts=8, num_experts_per_tok=3, decoder_sparse_step=2,
                             mlp_only_layers=[3], norm_topk_prob=True, use_sliding_window=True, sliding_window=6,
                             max_window_layers=4, rms_norm_eps=1e-6),
        seed=3003,
        prompt_len=20,
        desc="qwen2_moe in transformers' own layout (per-expert mlp.experts.E.*), bf16: 6 layers with "
        "decoder_sparse_step 2 and mlp_only_layers [3], so layers 1 and 5 are MoE and 0, 2, 3, 4 dense MLPs "
        "(intermediate 96); norm_topk_prob TRUE, 8 experts top-3, shared expert 48 wide; use_sliding_window with "
        "sliding_window 6 and max_window_layers 4, so layers 0 and 2 attend to the last 6 positions (layer_types in "
        "config.json); rope_theta 20000 in rope_parameters only",
    ),
]

if __name__ == "__main__":
    fam.main(CASES)
