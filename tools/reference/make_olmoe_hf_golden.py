"""Writes the OLMoE *semantics* golden cases from transformers' OlmoeForCausalLM (fp32, eager attention,
eager experts): tests/golden/olmoe_hf_q4_mixed, olmoe_hf_bf16, olmoe_hf_fused_experts.

- olmoe_hf_q4_mixed: an mlx-community-layout checkpoint written by affine_pack.py's numpy quantizer
  (stacked switch_mlp experts, U32 words, f32 scales/biases, two shards + index), 8-bit routers,
  6-bit down_proj in layer 1, 6-bit group-32 lm_head. The stored values are dequantized in numpy and
  loaded into transformers; mlx-lm's load_model + forward of the same folder is the cross-check.
- olmoe_hf_bf16: transformers' own save_pretrained (default save_original_format=True, which writes
  per-expert mlp.experts.E.{gate,up,down}_proj.weight) of a random model cast to bf16; logits from
  from_pretrained(..., dtype=float32) of that folder, i.e. f32 math on the bf16-rounded values.
- olmoe_hf_fused_experts: save_pretrained(save_original_format=False), which keeps the in-memory
  fused mlp.experts.gate_up_proj (E, 2F, H) / mlp.experts.down_proj (E, H, F); f32; clip_qkv set.

Usage: python make_olmoe_hf_golden.py [--out tests/golden] [--case NAME]
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import save_file
from transformers import OlmoeConfig, OlmoeForCausalLM

import affine_pack
import olmoe_ref_common as common

N_NEW = 64
STD = {"embed": 1.0, "attn": 0.25, "router": 0.5, "expert": 0.2, "lm_head": 0.3, "norm_spread": 0.5}
INIT_NOTE = (
    "Random weights (numpy seed {seed}): embed N(0,1), q/k/v/o N(0,0.25^2), router N(0,0.5^2), "
    "experts N(0,0.2^2), lm_head N(0,0.3^2), norm weights 1+U(-0.5,0.5)."
)


def hf_config(**kw):
    """OlmoeConfig as transformers 5.x builds it; to_dict() mirrors what save_pretrained writes."""
    base = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=False,
        rms_norm_eps=1e-5,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        eos_token_id=511,
        pad_token_id=1,
    )
    base.update(kw)
    return OlmoeConfig(**base)


# ---------------------------------------------------------------------------------------------------
# olmoe_hf_q4_mixed


def q4_mixed_overrides(cfg):
    """Per-module (bits, group_size) overrides, older mlx-lm style (no "mode" key)."""
    o = {f"model.layers.{L}.mlp.gate": {"group_size": 64, "bits": 8} for L in range(cfg["num_hidden_layers"])}
    o["model.layers.1.mlp.switch_mlp.down_proj"] = {"group_size": 64, "bits": 6}
    o["lm_head"] = {"group_size": 32, "bits": 6}
    return o


def write_q4_mixed(folder, seed):
    # Start from the exact config.json transformers 5.x writes, then add what an MLX conversion adds.
    hf_config(hidden_size=128, intermediate_size=64, num_experts_per_tok=2, rope_theta=50000.0).save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["OlmoeForCausalLM"]
    cfg["dtype"] = "float32"
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]  # both spellings, same value
    overrides = q4_mixed_overrides(cfg)
    q = {"group_size": 64, "bits": 4, **overrides}
    cfg["quantization"] = q
    cfg["quantization_config"] = q
    cfg = dict(sorted(cfg.items()))

    w = common.random_weights(cfg, seed, STD)
    tensors = {}
    for name, v in w.items():
        prefix = name[: -len(".weight")]
        if v.ndim == 1:  # norms stay float
            tensors[name] = v
            continue
        p = overrides.get(prefix, {"group_size": 64, "bits": 4})
        packed, s, b = affine_pack.quantize(v, p["bits"], p["group_size"], np.float32)
        tensors[f"{prefix}.weight"], tensors[f"{prefix}.scales"], tensors[f"{prefix}.biases"] = packed, s, b

    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for fname, keys in shards.items():
        save_file({k: np.ascontiguousarray(tensors[k]) for k in keys}, str(folder / fname), metadata={"format": "mlx"})
        weight_map.update({k: fname for k in keys})
    total = sum(t.nbytes for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))
    (folder / "config.json").write_text(json.dumps(cfg, indent=4))
    return cfg


def mlx_crosscheck(folder, prompt, greedy, model_config=None):
    """mlx-lm's load_model + forward (float params widened to f32) of a folder; logits and greedy ids."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(folder), model_config=model_config)
    widen = lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p  # noqa: E731
    model.update(tree_map(widen, model.parameters()))
    logits = np.array(model(mx.array([prompt]))[0])
    full = np.array(model(mx.array([prompt + greedy]))[0])
    ids = list(prompt)
    for _ in range(len(greedy)):
        ids.append(int(np.argmax(np.array(model(mx.array([ids]))[0, -1]))))
    return logits, full, ids[len(prompt) :]


def case_q4_mixed(folder, seed, prompt_len):
    cfg = write_q4_mixed(folder, seed)
    canon, qparams = common.dequantize_mlx_folder(folder)
    model = common.build_hf_model(cfg, common.canonical_to_hf_fused(canon))
    prompt = common.random_prompt(cfg["vocab_size"], prompt_len, seed + 7)
    logits, _ = common.hf_forward(model, prompt)
    greedy = common.hf_greedy(model, prompt, N_NEW)
    full, routers = common.hf_forward(model, prompt + greedy)

    m_logits, m_full, m_greedy = mlx_crosscheck(folder, prompt, greedy)
    cross = {"mlx_lm": common.compare(m_logits, logits)}
    cross["mlx_lm"]["full_sequence"] = common.compare(m_full, full)
    cross["mlx_lm"]["greedy_identical"] = m_greedy == greedy
    desc = (
        "mlx-community layout written with a numpy affine quantizer (tools/reference/affine_pack.py, "
        "bit-exact against mx.quantize/mx.dequantize for bits 2-8): stacked "
        "model.layers.L.mlp.switch_mlp.{gate,up,down}_proj.{weight U32,scales F32,biases F32}, embeddings "
        "and lm_head quantized, norms F32, two shards + model.safetensors.index.json, safetensors "
        "metadata format=mlx. quantization: default 4-bit group 64 (no 'mode' key, older mlx-lm style); "
        "overrides: model.layers.{0,1}.mlp.gate 8-bit g64, model.layers.1.mlp.switch_mlp.down_proj 6-bit "
        "g64, lm_head 6-bit group 32. norm_topk_prob false. config has both rope_theta and "
        "rope_parameters.rope_theta (50000). Reference = transformers on the numpy-dequantized stored "
        "values (quantization keys stripped from the config before OlmoeConfig.from_dict)"
    )
    return cfg, prompt, greedy, logits, full, routers, desc, cross, sorted(
        {(p["bits"], p["group_size"]) for p in qparams.values()}
    )


# ---------------------------------------------------------------------------------------------------
# olmoe_hf_bf16 / olmoe_hf_fused_experts (transformers' own writer)


def hf_saved_case(folder, seed, prompt_len, config, dtype, save_original_format):
    cfg0 = config.to_dict()
    w = common.random_weights(cfg0, seed, STD)
    torch.manual_seed(seed)
    model = OlmoeForCausalLM(config)
    sd = {k: torch.from_numpy(v) for k, v in common.canonical_to_hf_fused(w).items()}
    model.load_state_dict(sd, strict=True)
    model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True, save_original_format=save_original_format)

    ref = OlmoeForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    cfg = json.loads((folder / "config.json").read_text())
    prompt = common.random_prompt(cfg["vocab_size"], prompt_len, seed + 7)
    logits, _ = common.hf_forward(ref, prompt)
    greedy = common.hf_greedy(ref, prompt, N_NEW)
    full, routers = common.hf_forward(ref, prompt + greedy)

    # Independent read of the stored tensors (numpy reader): values equal what from_pretrained loaded.
    arrays, dtypes = common.read_model_folder(folder)
    loaded = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    canon = stored_to_canonical(arrays, cfg)
    via_numpy = common.canonical_to_hf_fused(canon)
    assert set(via_numpy) == set(loaded), sorted(set(via_numpy) ^ set(loaded))
    exact = all(np.array_equal(via_numpy[k], loaded[k]) for k in loaded)
    assert exact, "numpy-read stored values differ from transformers' loaded values"
    cross = {
        "stored_values_equal_loaded": exact,
        "cached_generate_greedy_identical": common.hf_greedy_cached(ref, prompt, N_NEW) == greedy,
    }
    return cfg, prompt, greedy, logits, full, routers, arrays, dtypes, canon, cross


def stored_to_canonical(arrays, cfg):
    """HF checkpoint tensors (per-expert or fused) -> canonical names with stacked experts."""
    out = {}
    E, F = cfg["num_experts"], cfg["intermediate_size"]
    for k, v in arrays.items():
        if ".mlp.experts." not in k:
            out[k] = v
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}.mlp"
        if f"{p}.experts.gate_up_proj" in arrays:
            gu = arrays[f"{p}.experts.gate_up_proj"]  # (E, 2F, H), gate rows first
            out[f"{p}.switch_mlp.gate_proj.weight"] = gu[:, :F]
            out[f"{p}.switch_mlp.up_proj.weight"] = gu[:, F:]
            out[f"{p}.switch_mlp.down_proj.weight"] = arrays[f"{p}.experts.down_proj"]
        else:
            for n in ("gate_proj", "up_proj", "down_proj"):
                out[f"{p}.switch_mlp.{n}.weight"] = np.stack(
                    [arrays[f"{p}.experts.{e}.{n}.weight"] for e in range(E)]
                )
    return out


def write_f32_canonical_as_mlx(folder, canon, cfg):
    """Writes canonical f32 weights as an unquantized mlx-lm folder (for the mlx-lm cross-check)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in canon.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(cfg))


def case_bf16(folder, seed, prompt_len, tmp):
    config = hf_config(num_experts_per_tok=4, norm_topk_prob=True, rope_theta=20000.0)
    cfg, prompt, greedy, logits, full, routers, arrays, dtypes, canon, cross = hf_saved_case(
        folder, seed, prompt_len, config, torch.bfloat16, True
    )
    assert set(dtypes.values()) == {"BF16"}
    # mlx-lm reads the per-expert layout itself (Model.sanitize stacks experts); its olmoe ModelArgs
    # has only a top-level rope_theta and would silently use 10000, so the value is passed explicitly.
    m_logits, m_full, m_greedy = mlx_crosscheck(folder, prompt, greedy, {"rope_theta": 20000.0})
    cross["mlx_lm"] = common.compare(m_logits, logits)
    cross["mlx_lm"]["full_sequence"] = common.compare(m_full, full)
    cross["mlx_lm"]["greedy_identical"] = m_greedy == greedy
    m_logits_default, _, _ = mlx_crosscheck(folder, prompt, greedy)
    cross["mlx_lm_without_rope_theta_override"] = common.compare(m_logits_default, logits)
    desc = (
        "transformers OlmoeForCausalLM, random weights set then model.to(torch.bfloat16), written by "
        "save_pretrained(safe_serialization=True) with the default save_original_format=True: per-expert "
        "tensors model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight, router model.layers.L.mlp.gate.weight, "
        "all BF16, safetensors metadata format=pt, plus generation_config.json. norm_topk_prob TRUE, top-4 of 8. "
        "config.json as transformers 5.x writes it: rope_parameters {rope_theta 20000, rope_type default}, no "
        "top-level rope_theta, 'dtype' instead of 'torch_dtype'. Reference = from_pretrained(dtype=float32) "
        "of the folder: f32 math on the bf16-rounded values"
    )
    return cfg, prompt, greedy, logits, full, routers, desc, cross


def case_fused(folder, seed, prompt_len, tmp):
    config = hf_config(vocab_size=256, eos_token_id=255, clip_qkv=2.0, rope_theta=300.0, rms_norm_eps=1e-6)
    cfg, prompt, greedy, logits, full, routers, arrays, dtypes, canon, cross = hf_saved_case(
        folder, seed, prompt_len, config, torch.float32, False
    )
    assert set(dtypes.values()) == {"F32"}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in arrays)
    # mlx-lm has no clip_qkv, so the fused-layout reading (gate rows first) is cross-checked on the same
    # weights with clip_qkv removed on both sides.
    noclip = dict(cfg, clip_qkv=None, rope_theta=cfg["rope_parameters"]["rope_theta"])
    hf_noclip = common.build_hf_model(noclip, common.canonical_to_hf_fused(canon))
    hf_nc_logits, _ = common.hf_forward(hf_noclip, prompt)
    mdir = tmp / "fused_noclip_mlx"
    write_f32_canonical_as_mlx(mdir, canon, noclip)
    m_logits, _, _ = mlx_crosscheck(mdir, prompt, greedy)
    cross["mlx_lm_vs_transformers_clip_qkv_removed"] = common.compare(m_logits, hf_nc_logits)
    cross["effect_of_clip_qkv"] = common.compare(hf_nc_logits, logits)
    desc = (
        "transformers OlmoeForCausalLM f32, written by save_pretrained(safe_serialization=True, "
        "save_original_format=False), which keeps the in-memory fused expert tensors: "
        "model.layers.L.mlp.experts.gate_up_proj (E, 2F, H) with gate rows [0, F) and up rows [F, 2F), "
        "model.layers.L.mlp.experts.down_proj (E, H, F), all F32. (With the default save_original_format=True "
        "transformers 5.x writes per-expert tensors instead, see olmoe_hf_bf16.) clip_qkv 2.0 (clamps q and k "
        "after q_norm/k_norm and v after v_proj, before rope), rope_theta 300 in rope_parameters, "
        "rms_norm_eps 1e-6, vocab 256, norm_topk_prob false"
    )
    return cfg, prompt, greedy, logits, full, routers, desc, cross


CASES = {
    "olmoe_hf_q4_mixed": (case_q4_mixed, 2001, 20),
    "olmoe_hf_bf16": (case_bf16, 2002, 16),
    "olmoe_hf_fused_experts": (case_fused, 2003, 28),
}


def run_case(case, out_root, tmp):
    fn, seed, prompt_len = CASES[case]
    folder = Path(out_root) / case
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if case == "olmoe_hf_q4_mixed":
        cfg, prompt, greedy, logits, full, routers, desc, cross, bits = fn(folder, seed, prompt_len)
        desc += f"; (bits, group_size) pairs present: {bits}"
    else:
        cfg, prompt, greedy, logits, full, routers, desc, cross = fn(folder, seed, prompt_len, tmp)
    v = common.versions()
    notes = (
        f"{desc}. {INIT_NOTE.format(seed=seed)} transformers {v['transformers']} / torch {v['torch']}, fp32, "
        f"attn_implementation=eager, experts_implementation=eager. greedy_ids: argmax by full recomputation "
        f"(no KV cache), EOS ({cfg['eos_token_id']}) not treated as a stop."
    )
    stab = common.stability_notes(full, routers, len(prompt), cfg["num_experts_per_tok"])
    common.write_golden(
        folder,
        case,
        f"transformers {v['transformers']} / torch {v['torch']}",
        prompt,
        greedy,
        logits,
        notes,
        extra={"reference_dtype": "float32", "stability": stab, "crosscheck": cross,
               "eos_in_greedy": cfg["eos_token_id"] in greedy},
    )
    print(f"{case}: {common.folder_size(folder)} bytes, prompt {len(prompt)}")
    print(f"  cross {json.dumps(cross)}")
    print(f"  stability {json.dumps(stab)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "tests" / "golden"))
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--tmp", default="/tmp/olmoe_hf_golden_tmp", help="scratch folder for cross-checks")
    args = ap.parse_args()
    tmp = Path(args.tmp)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for case in args.case or sorted(CASES):
        run_case(case, args.out, tmp)


if __name__ == "__main__":
    main()
