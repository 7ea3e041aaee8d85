"""Writes the dots1 golden cases (tests/golden/dots1_*): two mlx-community checkpoints quantized by mlx-lm (4-bit and
8-bit; routed experts stacked as mlp.experts.{gate,up,down}_proj, the router left dense) and one bf16 checkpoint
written by transformers, each with transformers' teacher-forced logits and greedy ids (see family_ref_common.py).

The correction biases are drawn positive (U(0, 0.2)) so that mlx-lm's grouped selection, which zeroes the dropped
groups' scores instead of masking them with -inf, picks the same experts as transformers and can cross-check.

Usage: python make_dots1_golden.py [--out tests/golden] [--case NAME ...]
"""

import family_ref_common as fam
from family_ref_common import FamilyCase


def hub_config(**over):
    """A config.json as rednote-hilab/dots.llm1.inst carries it (transformers 4.x field set), which mlx_lm.convert
    copies into mlx-community folders."""
    return fam.hub_config(
        {
            "architectures": ["Dots1ForCausalLM"],
            "attention_bias": False,
            "bos_token_id": None,
            "first_k_dense_replace": 1,
            "intermediate_size": 256,
            "max_window_layers": 62,
            "model_type": "dots1",
            "moe_intermediate_size": 64,
            "moe_layer_freq": 1,
            "n_group": 4,
            "n_routed_experts": 16,
            "n_shared_experts": 2,
            "norm_topk_prob": True,
            "num_experts_per_tok": 4,
            "num_hidden_layers": 3,
            "rms_norm_eps": 1e-05,
            "rope_scaling": None,
            "rope_theta": 10000000,
            "routed_scaling_factor": 2.5,
            "scoring_func": "noaux_tc",
            "sliding_window": None,
            "topk_group": 2,
            "topk_method": "noaux_tc",
            "transformers_version": "4.46.3",
            "use_sliding_window": False,
        },
        over,
    )


CASES = [
    FamilyCase(
        name="dots1_mlx_q4",
        kind="mlx",
        config=hub_config(),
        seed=6001,
        prompt_len=24,
        desc="dots1: per-head q/k RMSNorm, GQA 4/2, layer 0 dense (first_k_dense_replace 1, intermediate 256), layers "
        "1-2 MoE: sigmoid router with e_score_correction_bias used only to select, 16 experts in 4 groups of which "
        "the best 2 (sum of each group's top-2 choice scores) stay, top-4, weights renormalized (norm_topk_prob) and "
        "scaled by routed_scaling_factor 2.5, plus 2 shared experts (one 128-wide MLP); mlx layout: routed experts "
        "model.layers.L.mlp.experts.{gate,up,down}_proj stacked, router mlp.gate.weight and "
        "mlp.gate.e_score_correction_bias dense (mlx-lm does not quantize the router)",
    ),
    fam.mlx_q8_case(
        name="dots1_mlx_q8",
        config=hub_config(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                          first_k_dense_replace=0, num_key_value_heads=4, n_routed_experts=8, n_group=1, topk_group=1,
                          num_experts_per_tok=2, n_shared_experts=1, norm_topk_prob=False, routed_scaling_factor=1.0,
                          rope_theta=10000.0, torch_dtype="float16"),
        seed=6002,
        desc="dots1 8-bit group 32, float16: hidden 64, 2 layers both MoE (first_k_dense_replace 0), 4 heads (no GQA), "
        "8 experts in one group, top-2 not renormalized, scaling 1.0, 1 shared expert (32 wide)",
    ),
    FamilyCase(
        name="dots1_hf_bf16",
        kind="hf",
        config=fam.hf_config("dots1", 10000.0, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                             num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=2,
                             n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                             norm_topk_prob=False, routed_scaling_factor=1.5, attention_bias=True, sliding_window=6,
                             max_window_layers=2, rms_norm_eps=1e-6),
        seed=6003,
        prompt_len=20,
        desc="dots1 in transformers' own layout (per-expert mlp.experts.E.*), bf16: attention_bias TRUE (q/k/v/o), "
        "layer 0 dense, layers 1-3 MoE with 8 experts in 2 groups of which 1 stays, top-2 not renormalized, "
        "routed_scaling_factor 1.5, 1 shared expert; sliding_window 6 with max_window_layers 2, so layers 2 and 3 "
        "attend to the last 6 positions (layer_types in config.json)",
    ),
]

if __name__ == "__main__":
    fam.main(CASES)
