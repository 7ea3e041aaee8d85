"""Writes the qwen3_moe golden cases (tests/golden/qwen3_moe_*): two mlx-community checkpoints quantized by mlx-lm
(4-bit with mlx-lm's own 8-bit routers, and 8-bit) and one bf16 checkpoint written by transformers, each with
transformers' teacher-forced logits and greedy ids (see family_ref_common.py).

Usage: python make_qwen3_moe_golden.py [--out tests/golden] [--case NAME ...]
"""

import family_ref_common as fam
from family_ref_common import FamilyCase


def hub_config(**over):
    """A config.json as Qwen/Qwen3-30B-A3B carries it (transformers 4.x field set), which mlx_lm.convert copies."""
    return fam.hub_config(
        {
            "architectures": ["Qwen3MoeForCausalLM"],
            "attention_bias": False,
            "bos_token_id": 510,
            "decoder_sparse_step": 1,
            "head_dim": 64,
            "intermediate_size": 128,
            "max_window_layers": 48,
            "mlp_only_layers": [],
            "model_type": "qwen3_moe",
            "moe_intermediate_size": 64,
            "norm_topk_prob": True,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "num_hidden_layers": 3,
            "output_router_logits": False,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.001,
            "sliding_window": None,
            "transformers_version": "4.51.0",
            "use_sliding_window": False,
        },
        over,
    )


CASES = [
    FamilyCase(
        name="qwen3_moe_mlx_q4",
        kind="mlx",
        config=hub_config(mlp_only_layers=[1]),
        seed=4001,
        prompt_len=24,
        desc="qwen3_moe: per-head q/k RMSNorm, explicit head_dim 64 with hidden 128 and 4 heads (q width 256), GQA "
        "4/2, 8 experts top-2 renormalized (norm_topk_prob true), mlp_only_layers [1] (layer 1 a dense MLP, 128 "
        "wide); 4-bit group 64 with mlx-lm's qwen3_moe quant_predicate, which stores every router "
        "(model.layers.L.mlp.gate) at 8 bits",
    ),
    fam.mlx_q8_case(
        name="qwen3_moe_mlx_q8",
        config=hub_config(hidden_size=64, head_dim=16, num_hidden_layers=2, num_experts=16, num_experts_per_tok=4,
                          moe_intermediate_size=32, rope_theta=10000.0, torch_dtype="float16"),
        seed=4002,
        desc="qwen3_moe 8-bit group 32, float16: hidden 64, head_dim 16 (q width 64), GQA 4/2, 16 experts top-4, "
        "expert width 32",
    ),
    FamilyCase(
        name="qwen3_moe_hf_bf16",
        kind="hf",
        config=fam.hf_config("qwen3_moe", 5000.0, hidden_size=64, head_dim=32, intermediate_size=96,
                             moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                             num_key_value_heads=1, num_experts=8, num_experts_per_tok=3, mlp_only_layers=[0],
                             norm_topk_prob=False, attention_bias=True, use_sliding_window=True, sliding_window=7,
                             rms_norm_eps=1e-6),
        seed=4003,
        prompt_len=20,
        desc="qwen3_moe in transformers' own layout (per-expert mlp.experts.E.*), bf16: attention_bias TRUE (q/k/v/o "
        "biases, the q/k ones before the per-head norms), head_dim 32 with hidden 64 and 4 heads, GQA 4/1, "
        "mlp_only_layers [0], norm_topk_prob false, 8 experts top-3, use_sliding_window with sliding_window 7 (every "
        "layer attends to the last 7 positions), rope_theta 5000 in rope_parameters only",
    ),
]

if __name__ == "__main__":
    fam.main(CASES)
