"""Shared helpers for the OLMoE golden-case generators (make_olmoe_mlx_golden.py, make_olmoe_hf_golden.py).

Holds a numpy-only safetensors reader, numpy dequantization of mlx-community folders (via affine_pack.py),
seeded random OLMoE weights, the transformers reference runner (OlmoeForCausalLM, fp32, eager attention,
eager experts), stability/agreement measures and the golden.json / logits.npy writer.
"""

import json
import re
import struct
from pathlib import Path

import numpy as np

import affine_pack

# Tensor names below use the mlx-lm / mlx-community naming ("canonical" form of a weight dict):
#   model.embed_tokens.weight (vocab_size, hidden_size), lm_head.weight (vocab_size, hidden_size),
#   model.norm.weight, model.layers.L.{input_layernorm,post_attention_layernorm}.weight,
#   model.layers.L.self_attn.{q,k,v,o}_proj.weight, model.layers.L.self_attn.{q,k}_norm.weight,
#   model.layers.L.mlp.gate.weight (n_experts, hidden_size),
#   model.layers.L.mlp.switch_mlp.{gate,up}_proj.weight (n_experts, moe_intermediate, hidden_size),
#   model.layers.L.mlp.switch_mlp.down_proj.weight (n_experts, hidden_size, moe_intermediate).

_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "U32": np.uint32, "I64": np.int64}


def read_safetensors(path):
    """Reads a .safetensors file without the safetensors package: returns (arrays, dtypes, metadata).

    BF16 and F16 tensors are widened to float32 exactly; U32 stays uint32.
    """
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", None)
    data = raw[8 + n :]
    arrays, dtypes = {}, {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        a = np.frombuffer(data[begin:end], dtype=_ST_DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        elif info["dtype"] == "F16":
            a = a.astype(np.float32)
        arrays[name] = a.copy()
        dtypes[name] = info["dtype"]
    return arrays, dtypes, meta


def read_model_folder(folder):
    """All tensors of a model folder (single file or shards listed in model.safetensors.index.json)."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    arrays, dtypes = {}, {}
    for f in files:
        a, d, _ = read_safetensors(folder / f)
        assert not (set(a) & set(arrays)), f"duplicate tensor names in {f}"
        arrays.update(a)
        dtypes.update(d)
    return arrays, dtypes


def dequantize_mlx_folder(folder):
    """Reads an mlx-community-layout folder and returns (canonical f32 weights, per-module quant params).

    Bits and group size come from config.json (default block plus per-module overrides) and are
    cross-checked against the tensor shapes; dequantization is affine_pack's numpy code, not MLX's.
    """
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    qcfg = cfg.get("quantization", {})
    arrays, _ = read_model_folder(folder)
    out, used = {}, {}
    for name in sorted(arrays):
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        prefix = name[: -len(".weight")] if name.endswith(".weight") else None
        if prefix is not None and f"{prefix}.scales" in arrays:
            params = qcfg.get(prefix, qcfg)
            bits, gs = params["bits"], params["group_size"]
            w, s, b = arrays[name], arrays[f"{prefix}.scales"], arrays[f"{prefix}.biases"]
            n_in = s.shape[-1] * gs
            assert w.shape[-1] * 32 == n_in * bits, f"{prefix}: packed shape {w.shape} vs bits {bits} gs {gs}"
            out[name] = affine_pack.dequantize(w, s, b, bits, gs)
            used[prefix] = {"bits": bits, "group_size": gs}
        else:
            out[name] = arrays[name].astype(np.float32)
    return out, used


def random_weights(cfg, seed, std):
    """Seeded random OLMoE weights in canonical naming, float32.

    std: dict with keys embed, attn, router, expert, lm_head, norm_spread. Norm weights are
    1 + uniform(-norm_spread, norm_spread) so that a missing or misplaced norm weight shows.
    """
    rng = np.random.default_rng(seed)
    H, V, E, F = cfg["hidden_size"], cfg["vocab_size"], cfg["num_experts"], cfg["intermediate_size"]
    nh = cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    hd = H // nh

    def normal(shape, s):
        return (rng.standard_normal(shape) * s).astype(np.float32)

    def norm_w(n):
        return (1.0 + rng.uniform(-std["norm_spread"], std["norm_spread"], n)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((V, H), std["embed"])}
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}"
        w[f"{p}.input_layernorm.weight"] = norm_w(H)
        w[f"{p}.self_attn.q_proj.weight"] = normal((nh * hd, H), std["attn"])
        w[f"{p}.self_attn.k_proj.weight"] = normal((nkv * hd, H), std["attn"])
        w[f"{p}.self_attn.v_proj.weight"] = normal((nkv * hd, H), std["attn"])
        w[f"{p}.self_attn.o_proj.weight"] = normal((H, nh * hd), std["attn"])
        w[f"{p}.self_attn.q_norm.weight"] = norm_w(nh * hd)
        w[f"{p}.self_attn.k_norm.weight"] = norm_w(nkv * hd)
        w[f"{p}.post_attention_layernorm.weight"] = norm_w(H)
        w[f"{p}.mlp.gate.weight"] = normal((E, H), std["router"])
        w[f"{p}.mlp.switch_mlp.gate_proj.weight"] = normal((E, F, H), std["expert"])
        w[f"{p}.mlp.switch_mlp.up_proj.weight"] = normal((E, F, H), std["expert"])
        w[f"{p}.mlp.switch_mlp.down_proj.weight"] = normal((E, H, F), std["expert"])
    w["model.norm.weight"] = norm_w(H)
    w["lm_head.weight"] = normal((V, H), std["lm_head"])
    return w


def random_prompt(vocab_size, length, seed):
    rng = np.random.default_rng(seed)
    return [int(t) for t in rng.integers(2, vocab_size, size=length)]


def canonical_to_hf_fused(w):
    """Canonical names -> the in-memory state dict of transformers 5.x OlmoeForCausalLM (fused experts)."""
    out = {}
    for k, v in w.items():
        if ".mlp.switch_mlp." in k:
            continue
        out[k] = v
    layers = sorted({int(k.split(".")[2]) for k in w if k.startswith("model.layers.")})
    for L in layers:
        p = f"model.layers.{L}.mlp"
        g, u = w[f"{p}.switch_mlp.gate_proj.weight"], w[f"{p}.switch_mlp.up_proj.weight"]
        out[f"{p}.experts.gate_up_proj"] = np.concatenate([g, u], axis=1)  # (E, 2F, H), gate rows first
        out[f"{p}.experts.down_proj"] = w[f"{p}.switch_mlp.down_proj.weight"]  # (E, H, F)
    return out


def hf_config_for_transformers(cfg):
    """A config.json dict minus the MLX quantization keys, which transformers would try to act on."""
    return {k: v for k, v in cfg.items() if k not in ("quantization", "quantization_config")}


def build_hf_model(cfg, hf_state_dict=None):
    """OlmoeForCausalLM in fp32 with eager attention and eager experts, optionally loaded (strict)."""
    import torch
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = OlmoeConfig.from_dict(hf_config_for_transformers(cfg))
    torch.manual_seed(0)
    model = OlmoeForCausalLM._from_config(
        config, attn_implementation="eager", experts_implementation="eager", dtype=torch.float32
    )
    model.eval()
    if hf_state_dict is not None:
        sd = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in hf_state_dict.items()}
        missing, unexpected = model.load_state_dict(sd, strict=True)
        assert not missing and not unexpected
    assert model.config._attn_implementation == "eager"
    return model


def hf_forward(model, ids):
    """Teacher-forced logits (len(ids), vocab) float32 and router logits per layer (len(ids), n_experts)."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long), use_cache=False, output_router_logits=True)
    logits = out.logits[0].float().numpy()
    routers = [r.reshape(len(ids), -1).float().numpy() for r in out.router_logits]
    return logits, routers


def hf_greedy(model, prompt, n_new):
    """Greedy continuation by full recomputation (no KV cache), no stopping on EOS."""
    ids = list(prompt)
    for _ in range(n_new):
        logits, _ = hf_forward(model, ids)
        ids.append(int(np.argmax(logits[-1])))
    return ids[len(prompt) :]


def hf_greedy_cached(model, prompt, n_new):
    """Greedy continuation with transformers' generate() (KV cache path), EOS ignored."""
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], dtype=torch.long),
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def top2_margin(logits):
    s = np.sort(logits, axis=-1)
    return s[..., -1] - s[..., -2]


def router_gap(router_logits, top_k):
    """Smallest router-logit gap between the k-th and (k+1)-th expert over all tokens of one layer.

    Logit space (= log-probability space) is where an implementation's rounding error lives, so this
    is the margin that decides whether a different implementation can pick a different expert set.
    """
    s = -np.sort(-router_logits.astype(np.float64), axis=-1)
    return float((s[:, top_k - 1] - s[:, top_k]).min())


def stability_notes(full_logits, routers, prompt_len, top_k):
    """Numbers a consumer needs to judge tolerances: greedy argmax margins and router top-k gaps."""
    gen_logits = full_logits[prompt_len - 1 : -1]
    return {
        "min_greedy_top2_logit_margin": float(top2_margin(gen_logits).min()),
        "min_prompt_top2_logit_margin": float(top2_margin(full_logits[:prompt_len]).min()),
        "min_router_topk_logit_gap": min(router_gap(r, top_k) for r in routers),
        "logit_std": float(full_logits[:prompt_len].std()),
    }


def compare(a, b):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    rel = float(np.linalg.norm(a64 - b64) / np.linalg.norm(b64))
    agree = float(np.mean(np.argmax(a, -1) == np.argmax(b, -1)))
    return {"rel_l2": rel, "max_abs": float(np.abs(a64 - b64).max()), "argmax_agreement": agree}


def _join_ints(m):
    return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"


def write_golden(folder, case, source, prompt, greedy, logits, notes, extra=None):
    folder = Path(folder)
    logits = np.ascontiguousarray(logits, dtype=np.float32)
    assert logits.shape[0] == len(prompt)
    np.save(folder / "logits.npy", logits)
    g = {
        "case": case,
        "source": source,
        "prompt_ids": [int(t) for t in prompt],
        "greedy_ids": [int(t) for t in greedy],
        "logits_file": "logits.npy",
        "logits_shape": list(logits.shape),
        "notes": notes,
    }
    if extra:
        g.update(extra)
    text = json.dumps(g, indent=2)
    # Integer lists on one line each, so prompt_ids / greedy_ids stay readable in diffs.
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", _join_ints, text)
    (folder / "golden.json").write_text(text + "\n")


def versions():
    import importlib.metadata as md

    return {p: md.version(p) for p in ("transformers", "torch", "mlx", "mlx-lm", "numpy")}


def folder_size(folder):
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())
