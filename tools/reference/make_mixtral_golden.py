"""Writes the mixtral golden cases (tests/golden/mixtral_*): two mlx-community checkpoints quantized by mlx-lm
(4-bit and 8-bit; block_sparse_moe.switch_mlp naming) and one bf16 checkpoint written by transformers
(block_sparse_moe.experts.E.w1/w2/w3), each with transformers' teacher-forced logits and greedy ids
(see family_ref_common.py).

Usage: python make_mixtral_golden.py [--out tests/golden] [--case NAME ...]
"""

import family_ref_common as fam
from family_ref_common import FamilyCase


def hub_config(**over):
    """A config.json as mistralai/Mixtral-8x7B-v0.1 carries it (transformers 4.x field set), which mlx_lm.convert
    copies into mlx-community folders."""
    return fam.hub_config(
        {
            "architectures": ["MixtralForCausalLM"],
            "bos_token_id": 1,
            "eos_token_id": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 32768,
            "model_type": "mixtral",
            "num_experts_per_tok": 2,
            "num_hidden_layers": 2,
            "num_local_experts": 8,
            "output_router_logits": False,
            "rms_norm_eps": 1e-05,
            "rope_theta": 1000000.0,
            "router_aux_loss_coef": 0.02,
            "sliding_window": None,
            "transformers_version": "4.36.0.dev0",
        },
        over,
    )


CASES = [
    FamilyCase(
        name="mixtral_mlx_q4",
        kind="mlx",
        config=hub_config(),
        seed=5001,
        prompt_len=24,
        desc="mixtral: GQA 4/2, 8 experts top-2 weighted by a softmax over the 2 selected router logits, no sliding "
        "window; mlx layout model.layers.L.block_sparse_moe.gate and block_sparse_moe.switch_mlp.{gate,up,down}_proj "
        "(mlx-lm renames the HF w1/w3/w2)",
    ),
    fam.mlx_q8_case(
        name="mixtral_mlx_q8",
        config=hub_config(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_key_value_heads=1,
                          num_local_experts=4, rope_theta=10000.0, torch_dtype="float16"),
        seed=5002,
        desc="mixtral 8-bit group 32, float16: hidden 64, 3 layers, GQA 4/1, 4 experts top-2, expert width 128",
    ),
    FamilyCase(
        name="mixtral_hf_bf16",
        kind="hf",
        config=fam.hf_config("mixtral", 30000.0, hidden_size=64, head_dim=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=3,
                             sliding_window=5, rms_norm_eps=1e-5, bos_token_id=1),
        seed=5003,
        prompt_len=20,
        desc="mixtral in transformers' own layout (model.layers.L.block_sparse_moe.experts.E.{w1,w2,w3}.weight = "
        "gate/down/up, block_sparse_moe.gate.weight), bf16: explicit head_dim 32 with hidden 64 and 4 heads (q width "
        "128), GQA 4/2, 8 experts top-3 (transformers: softmax over all, top-3, renormalized), sliding_window 5 "
        "(every layer attends to the last 5 positions), rope_theta 30000 in rope_parameters only",
    ),
]

if __name__ == "__main__":
    fam.main(CASES)
