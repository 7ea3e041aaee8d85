"""Writes the OLMoE *format* golden cases with MLX itself: tests/golden/olmoe_mlx_q4 and olmoe_mlx_mixed.

Each model is built as mlx_lm.models.olmoe.Model from an HF-style config dict, given seeded random
weights, cast to the storage dtype and quantized with mlx_lm.utils.quantize_model, then saved with
mlx_lm.utils.save_model + save_config exactly as mlx_lm.convert saves mlx-community checkpoints.
Reference logits and greedy ids come from mlx-lm's forward of the checkpoint reloaded with
mlx_lm.utils.load_model, with every float parameter widened to float32 (exact) so the reference is f32.
The same stored values are then dequantized in numpy and run through transformers' OlmoeForCausalLM as
a cross-check; the agreement figures go into golden.json ("crosscheck").

Usage: python make_olmoe_mlx_golden.py [--out tests/golden] [--case olmoe_mlx_q4|olmoe_mlx_mixed]
"""

import argparse
import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map, tree_unflatten
from mlx_lm.generate import generate_step
from mlx_lm.models import olmoe
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

import olmoe_ref_common as common

N_NEW = 64


def hub_style_config(**over):
    """An OLMoE config.json as the Hub's allenai/OLMoE-1B-7B-0125 carries it (transformers 4.x field set:
    top-level rope_theta, torch_dtype), which is what mlx_lm.convert copies into mlx-community folders."""
    cfg = {
        "architectures": ["OlmoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "clip_qkv": None,
        "eos_token_id": 511,
        "hidden_act": "silu",
        "hidden_size": 128,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "max_position_embeddings": 4096,
        "model_type": "olmoe",
        "norm_topk_prob": False,
        "num_attention_heads": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "pad_token_id": 1,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "router_aux_loss_coef": 0.01,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.47.0",
        "use_cache": True,
        "vocab_size": 512,
    }
    cfg.update(over)
    return cfg


STD = {"embed": 1.0, "attn": 0.25, "router": 0.5, "expert": 0.2, "lm_head": 0.3, "norm_spread": 0.5}


def mixed_predicate(path, module):
    """8-bit routers everywhere, 6-bit down_proj in layer 1, 4-bit group-64 everything else."""
    if path.endswith(".mlp.gate"):
        return {"group_size": 64, "bits": 8, "mode": "affine"}
    if path == "model.layers.1.mlp.switch_mlp.down_proj":
        return {"group_size": 64, "bits": 6, "mode": "affine"}
    return True


CASES = {
    "olmoe_mlx_q4": dict(
        config=hub_style_config(),
        dtype="bfloat16",
        seed=1001,
        prompt_len=24,
        predicate=None,
        desc="4-bit group-64 affine everywhere (embeddings, attention, router, experts, lm_head); "
        "bf16 scales/biases/norms, as mlx_lm.convert -q writes a bf16 source model",
    ),
    "olmoe_mlx_mixed": dict(
        config=hub_style_config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=3,
            num_experts_per_tok=4,
            rope_theta=1000.0,
            rms_norm_eps=1e-06,
            torch_dtype="float16",
        ),
        dtype="float16",
        seed=1002,
        prompt_len=32,
        predicate=mixed_predicate,
        desc="4-bit group-64 default, 8-bit router (model.layers.L.mlp.gate) in every layer, 6-bit "
        "model.layers.1.mlp.switch_mlp.down_proj (2 groups per row); float16 scales/biases/norms "
        "(the default of older mlx_lm.convert); quant_predicate passed to mlx_lm.utils.quantize_model",
    ),
}


def build_and_save(case, spec, folder):
    cfg = dict(spec["config"])
    model = olmoe.Model(olmoe.ModelArgs.from_dict(cfg))
    weights = common.random_weights(cfg, spec["seed"], STD)
    want = {k for k, _ in tree_flatten(model.parameters())}
    assert want == set(weights), sorted(want ^ set(weights))
    dtype = getattr(mx, spec["dtype"])
    model.update(tree_unflatten([(k, mx.array(v).astype(dtype)) for k, v in weights.items()]))
    mx.eval(model.parameters())
    model, qcfg = quantize_model(model, cfg, 64, 4, mode="affine", quant_predicate=spec["predicate"])
    save_model(folder, model)
    save_config(qcfg, config_path=folder / "config.json")


def mlx_reference(folder, prompt):
    model, _ = load_model(folder)
    widen = lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p  # noqa: E731
    model.update(tree_map(widen, model.parameters()))
    mx.eval(model.parameters())
    logits = np.array(model(mx.array([prompt]))[0].astype(mx.float32))
    greedy = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=N_NEW, sampler=lambda x: mx.argmax(x, axis=-1)):
        greedy.append(int(tok.item() if hasattr(tok, "item") else tok))
    # The same continuation without a KV cache: full recomputation each step.
    ids = list(prompt)
    for _ in range(N_NEW):
        ids.append(int(np.argmax(np.array(model(mx.array([ids]))[0, -1]))))
    assert ids[len(prompt) :] == greedy, "mlx-lm cached and uncached greedy disagree"
    full = np.array(model(mx.array([prompt + greedy]))[0].astype(mx.float32))
    return logits, greedy, full


def run_case(case, out_root):
    spec = CASES[case]
    folder = Path(out_root) / case
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    build_and_save(case, spec, folder)
    cfg = json.loads((folder / "config.json").read_text())
    prompt = common.random_prompt(cfg["vocab_size"], spec["prompt_len"], spec["seed"] + 7)

    logits, greedy, full = mlx_reference(folder, prompt)

    # Cross-check: numpy dequantization of the stored values, forward in transformers (fp32, eager).
    canon, qparams = common.dequantize_mlx_folder(folder)
    hf = common.build_hf_model(cfg, common.canonical_to_hf_fused(canon))
    hf_logits, _ = common.hf_forward(hf, prompt)
    hf_full, routers = common.hf_forward(hf, prompt + greedy)
    hf_greedy = common.hf_greedy(hf, prompt, N_NEW)
    cross = common.compare(logits, hf_logits)
    cross["full_sequence"] = common.compare(full, hf_full)
    cross["greedy_identical"] = hf_greedy == greedy
    cross["greedy_first_divergence"] = next((i for i, (a, b) in enumerate(zip(hf_greedy, greedy)) if a != b), None)

    v = common.versions()
    stab = common.stability_notes(full, routers, len(prompt), cfg["num_experts_per_tok"])
    bits_used = sorted({(p["bits"], p["group_size"]) for p in qparams.values()})
    notes = (
        f"{spec['desc']}. Random weights (numpy seed {spec['seed']}): embed N(0,1), q/k/v/o N(0,0.25^2), "
        f"router N(0,0.5^2), experts N(0,0.2^2), lm_head N(0,0.3^2), norm weights 1+U(-0.5,0.5); cast to "
        f"{spec['dtype']} before quantization. Written by mlx_lm.utils.quantize_model + save_model + save_config "
        f"(save_model also writes model.safetensors.index.json; safetensors metadata format=mlx). Reference = "
        f"mlx-lm {v['mlx-lm']} forward (mlx {mx.__version__}, CPU) of the reloaded checkpoint with every float "
        f"parameter widened to float32, so logits are f32 math on the stored values. greedy_ids: argmax, "
        f"mlx-lm generate_step (KV cache), identical to uncached recomputation; EOS ({cfg['eos_token_id']}) not "
        f"treated as a stop. (bits, group_size) pairs present: {bits_used}."
    )
    common.write_golden(
        folder,
        case,
        f"mlx-lm {v['mlx-lm']} / mlx {mx.__version__} (cross-checked with transformers {v['transformers']})",
        prompt,
        greedy,
        logits,
        notes,
        extra={"reference_dtype": "float32", "stability": stab, "crosscheck_transformers": cross,
               "eos_in_greedy": cfg["eos_token_id"] in greedy},
    )
    print(f"{case}: {common.folder_size(folder)} bytes, prompt {len(prompt)}, cross {json.dumps(cross)}")
    print(f"  stability {json.dumps(stab)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "tests" / "golden"))
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    args = ap.parse_args()
    for case in args.case or sorted(CASES):
        run_case(case, args.out)


if __name__ == "__main__":
    main()
