"""Shared helpers for the golden cases of the MoE families qwen2_moe, qwen3_moe, mixtral and dots1
(make_<family>_golden.py).

A family's cases are declared as data (FamilyCase) and run by run_cases():

* mlx cases: the model is built as mlx-lm's own `mlx_lm.models.<family>.Model` from a Hub-style config.json dict,
  given seeded random weights (numpy), cast to the storage dtype, quantized by `mlx_lm.utils.quantize_model`
  (with the model's own quant_predicate, e.g. 8-bit routers for qwen3_moe) and written by `save_model` +
  `save_config`, exactly as `mlx_lm.convert` writes mlx-community checkpoints.
* hf cases: transformers' `<Family>ForCausalLM` with seeded random weights, cast to bfloat16 and written by
  `save_pretrained` (per-expert tensors, transformers' default "original format").

Reference for every case: transformers (fp32, attn_implementation="eager", experts_implementation="eager") on the
stored values (mlx cases: dequantized by affine_pack.py in numpy, not by MLX), teacher-forced logits of the prompt
and 64 greedy ids by full recomputation. Cross-checks recorded in golden.json: mlx-lm's own forward of the folder
(mlx cases), generate() with the KV cache, and (hf cases) the stored values read by numpy against what
from_pretrained loaded.
"""

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import olmoe_ref_common as common

N_NEW = 64

# transformers classes and mlx-lm module per model_type.
CLASSES = {
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "dots1": ("Dots1Config", "Dots1ForCausalLM"),
}

# Spreads of the random weights: large enough that logits and router choices stay away from ties.
STD = {
    "embed": 1.0,  # embed_tokens: N(0, s^2)
    "attn": 0.25,  # q/k/v/o_proj
    "attn_bias": 0.3,  # q/k/v/o_proj.bias
    "router": 0.5,  # mlp.gate (softmax routers)
    "sigmoid_router": 0.1,  # dots1 mlp.gate: keeps sigmoid scores off saturation (and off f32 ties at 1.0)
    "correction_bias": 0.2,  # dots1 e_score_correction_bias: U(0, s), positive so mlx-lm's selection agrees
    "expert": 0.2,  # routed experts
    "mlp": 0.2,  # dense MLPs and shared experts
    "shared_gate": 0.5,  # qwen2_moe shared_expert_gate
    "lm_head": 0.3,
    "norm_spread": 0.5,  # every RMSNorm weight: 1 + U(-s, s)
}
INIT_NOTE = (
    "Random weights (numpy seed {seed}): embed N(0,1), q/k/v/o N(0,0.25^2), attention biases N(0,0.3^2), softmax "
    "routers N(0,0.5^2), dots1 sigmoid router N(0,0.1^2) with e_score_correction_bias U(0,0.2), routed experts "
    "N(0,0.2^2), dense MLPs and shared experts N(0,0.2^2), shared_expert_gate N(0,0.5^2), lm_head N(0,0.3^2), every "
    "RMSNorm weight 1+U(-0.5,0.5)."
)


@dataclass
class FamilyCase:
    name: str
    kind: str  # "mlx" (mlx-lm quantize + save) or "hf" (transformers save_pretrained, bf16)
    config: dict  # config.json fields (HF names) the model is built from
    seed: int
    prompt_len: int
    desc: str
    bits: int = 4  # mlx cases
    group_size: int = 64
    dtype: str = "bfloat16"  # mlx cases: storage dtype of floats (scales, biases, norms, dense layers)
    mlx_crosscheck: bool = True  # whether mlx-lm can express the config (else skipped, with the reason)
    mlx_skip_reason: str = ""
    extra: dict = field(default_factory=dict)


# Fields every family's Hub-style tiny config.json shares (transformers 4.x field set, as mlx_lm.convert copies it).
HUB_COMMON = {
    "attention_dropout": 0.0,
    "eos_token_id": 511,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": 512,
}


def hub_config(family_fields, over):
    """HUB_COMMON, then the family's own fields, keys sorted as the Hub stores them; then `over` (a case's changes;
    new keys go last, as dict.update puts them)."""
    cfg = dict(HUB_COMMON)
    cfg.update(family_fields)
    cfg = dict(sorted(cfg.items()))
    cfg.update(over)
    return cfg


def hf_config(model_type, rope_theta, **fields):
    """A transformers-5 style config for an hf case: rope_theta only inside rope_parameters, plus the fields every
    family's hf case shares (vocab 512, max_position_embeddings 4096, eos 511, untied lm_head)."""
    cfg = dict(model_type=model_type, vocab_size=512)
    cfg.update(fields)
    cfg.update(rope_parameters={"rope_theta": rope_theta, "rope_type": "default"}, max_position_embeddings=4096,
               eos_token_id=511, tie_word_embeddings=False)
    return cfg


def mlx_q8_case(name, config, seed, desc):
    """The second mlx case of every family: 8-bit group 32, float16 storage, a 20-token prompt."""
    return FamilyCase(name=name, kind="mlx", config=config, seed=seed, prompt_len=20, bits=8, group_size=32,
                      dtype="float16", desc=desc)


def init_for(name):
    """(kind, spread) of a weight's random init, from its name (canonical mlx-lm or transformers naming)."""
    if name.endswith("e_score_correction_bias"):
        return "uniform01", STD["correction_bias"]
    if "norm" in name and name.endswith(".weight"):
        return "norm", STD["norm_spread"]
    if name.startswith("model.embed_tokens"):
        return "normal", STD["embed"]
    if name.startswith("lm_head"):
        return "normal", STD["lm_head"]
    if ".self_attn." in name:
        return "normal", STD["attn_bias"] if name.endswith(".bias") else STD["attn"]
    if name.endswith("shared_expert_gate.weight"):
        return "normal", STD["shared_gate"]
    if re.search(r"\.(mlp|block_sparse_moe)\.gate\.weight$", name):
        return "router", None
    if ".switch_mlp." in name or ".experts." in name:
        return "normal", STD["expert"]
    if ".mlp." in name:
        return "normal", STD["mlp"]
    raise ValueError(f"no init rule for {name}")


def random_weights(named_shapes, seed, model_type):
    """Seeded float32 weights for (name, shape) pairs, drawn in sorted name order."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in sorted(named_shapes):
        shape = tuple(named_shapes[name])
        kind, s = init_for(name)
        if kind == "router":
            kind, s = "normal", STD["sigmoid_router" if model_type == "dots1" else "router"]
        if kind == "normal":
            out[name] = (rng.standard_normal(shape) * s).astype(np.float32)
        elif kind == "norm":
            out[name] = (1.0 + rng.uniform(-s, s, shape)).astype(np.float32)
        else:
            out[name] = rng.uniform(0.0, s, shape).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------------
# name mappings


def canonical_to_hf(w):
    """mlx-lm names (stacked experts) -> the in-memory state dict of transformers 5.x (fused experts):
    `{mlp,block_sparse_moe}.switch_mlp.*` and dots1's stacked `mlp.experts.{gate,up,down}_proj.weight` become
    `mlp.experts.gate_up_proj` (E, 2F, H) (gate rows first) and `mlp.experts.down_proj` (E, H, F); mixtral's
    `block_sparse_moe.gate` becomes `mlp.gate`."""
    out, stacked = {}, {}
    for k, v in w.items():
        m = re.match(r"(model\.layers\.\d+)\.(mlp|block_sparse_moe)\.(switch_mlp|experts)\.(gate|up|down)_proj\.weight$", k)
        if m and v.ndim == 3:
            stacked.setdefault(m.group(1), {})[m.group(4)] = v
            continue
        out[k.replace(".block_sparse_moe.", ".mlp.")] = v
    for layer, p in stacked.items():
        out[f"{layer}.mlp.experts.gate_up_proj"] = np.concatenate([p["gate"], p["up"]], axis=1)
        out[f"{layer}.mlp.experts.down_proj"] = p["down"]
    return out


def stored_hf_to_memory(arrays):
    """Tensors as transformers' save_pretrained writes them (per expert; mixtral w1/w3/w2 under block_sparse_moe)
    -> the in-memory state dict (fused experts), read independently of transformers."""
    per, out = {}, {}
    for k, v in arrays.items():
        m = re.match(r"(model\.layers\.\d+)\.(mlp|block_sparse_moe)\.experts\.(\d+)\.(\w+)\.weight$", k)
        if m:
            proj = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}.get(m.group(4), m.group(4))
            per.setdefault(m.group(1), {}).setdefault(proj, {})[int(m.group(3))] = v
            continue
        out[k.replace(".block_sparse_moe.", ".mlp.")] = v
    for layer, p in per.items():
        st = {n: np.stack([p[n][e] for e in sorted(p[n])]) for n in p}
        out[f"{layer}.mlp.experts.gate_up_proj"] = np.concatenate([st["gate_proj"], st["up_proj"]], axis=1)
        out[f"{layer}.mlp.experts.down_proj"] = st["down_proj"]
    return out


# ---------------------------------------------------------------------------------------------------
# transformers


def hf_classes(model_type):
    import transformers

    c, m = CLASSES[model_type]
    return getattr(transformers, c), getattr(transformers, m)


def build_hf_model(cfg, state_dict=None):
    """<Family>ForCausalLM in fp32, eager attention and experts, optionally loaded (strict)."""
    import torch

    config_cls, model_cls = hf_classes(cfg["model_type"])
    config = config_cls.from_dict(common.hf_config_for_transformers(cfg))
    torch.manual_seed(0)
    model = model_cls._from_config(config, attn_implementation="eager", experts_implementation="eager",
                                   dtype=torch.float32).eval()
    if state_dict is not None:
        sd = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in state_dict.items()}
        missing, unexpected = model.load_state_dict(sd, strict=True)
        assert not missing and not unexpected
    assert model.config._attn_implementation == "eager"
    return model


def routers_of(model):
    """The router modules of a transformers MoE model, in layer order."""
    return [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")]


def hf_forward(model, ids):
    """Teacher-forced logits (len(ids), vocab) float32 and, per MoE layer, the router's input logits
    (len(ids), n_experts) as the router module saw them (captured with forward hooks)."""
    import torch

    captured = []
    hooks = [r.register_forward_hook(lambda m, i, o: captured.append((m, o[0].detach().float().numpy())))
             for r in routers_of(model)]
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids], dtype=torch.long), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return out.logits[0].float().numpy(), captured


def hf_greedy(model, prompt, n_new):
    ids = list(prompt)
    for _ in range(n_new):
        logits, _ = hf_forward(model, ids)
        ids.append(int(np.argmax(logits[-1])))
    return ids[len(prompt):]


# ---------------------------------------------------------------------------------------------------
# stability


def selection_gap(router, logits, cfg):
    """Smallest margin, over tokens, that decides the selected expert set of one MoE layer.

    softmax routers (qwen2_moe, qwen3_moe, mixtral): router-logit gap between the k-th and (k+1)-th expert.
    dots1: gap of the choice scores sigmoid(logit) + e_score_correction_bias between the k-th and (k+1)-th kept
    expert, and between the topk_group-th and next group score when groups are dropped.
    """
    k = cfg["num_experts_per_tok"]
    if cfg["model_type"] != "dots1":
        return common.router_gap(logits, k)
    bias = router.e_score_correction_bias.detach().float().numpy().astype(np.float64)
    c = 1.0 / (1.0 + np.exp(-logits.astype(np.float64))) + bias
    n_group, topk_group = cfg.get("n_group") or 1, cfg.get("topk_group") or 1
    gaps = []
    if topk_group < n_group:
        g = np.sort(c.reshape(c.shape[0], n_group, -1), axis=-1)[..., -2:].sum(-1)
        gs = -np.sort(-g, axis=-1)
        gaps.append(float((gs[:, topk_group - 1] - gs[:, topk_group]).min()))
        keep = np.argsort(-g, axis=-1, kind="stable")[:, :topk_group]
        mask = np.zeros_like(g, dtype=bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        c = np.where(np.repeat(mask, c.shape[1] // n_group, axis=-1), c, -np.inf)
    s = -np.sort(-c, axis=-1)
    if s.shape[1] > k and np.isfinite(s[:, k]).all():
        gaps.append(float((s[:, k - 1] - s[:, k]).min()))
    return min(gaps) if gaps else float("inf")


def stability_notes(full_logits, routers, prompt_len, cfg):
    gen = full_logits[prompt_len - 1:-1]
    return {
        "min_greedy_top2_logit_margin": float(common.top2_margin(gen).min()),
        "min_prompt_top2_logit_margin": float(common.top2_margin(full_logits[:prompt_len]).min()),
        "min_router_selection_gap": min(selection_gap(r, l, cfg) for r, l in routers) if routers else None,
        "logit_std": float(full_logits[:prompt_len].std()),
    }


# ---------------------------------------------------------------------------------------------------
# mlx-lm


def mlx_module(model_type):
    import importlib

    return importlib.import_module(f"mlx_lm.models.{model_type}")


def write_mlx_case(case, folder):
    """Builds mlx-lm's model, sets random weights, casts, quantizes with mlx-lm and saves like mlx_lm.convert."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import quantize_model, save_config, save_model

    cfg = dict(case.config)
    mod = mlx_module(cfg["model_type"])
    model = mod.Model(mod.ModelArgs.from_dict(cfg))
    shapes = {k: v.shape for k, v in tree_flatten(model.parameters())}
    weights = random_weights(shapes, case.seed, cfg["model_type"])
    dtype = getattr(mx, case.dtype)
    model.update(tree_unflatten([(k, mx.array(v).astype(dtype)) for k, v in weights.items()]))
    mx.eval(model.parameters())
    model, qcfg = quantize_model(model, cfg, case.group_size, case.bits, mode="affine")
    save_model(folder, model)
    save_config(qcfg, config_path=folder / "config.json")


def mlx_crosscheck(folder, prompt, greedy):
    """mlx-lm load_model + forward of the folder with float parameters widened to f32: logits, greedy ids."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(folder))
    widen = lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p  # noqa: E731
    model.update(tree_map(widen, model.parameters()))
    logits = np.array(model(mx.array([prompt]))[0])
    ids = list(prompt)
    for _ in range(len(greedy)):
        ids.append(int(np.argmax(np.array(model(mx.array([ids]))[0, -1]))))
    return logits, ids[len(prompt):]


# ---------------------------------------------------------------------------------------------------
# cases


def write_hf_case(case, folder):
    """transformers model with random weights, cast to bfloat16, save_pretrained (per-expert tensors)."""
    import torch

    config_cls, model_cls = hf_classes(case.config["model_type"])
    config = config_cls(**{k: v for k, v in case.config.items() if k != "model_type"})
    torch.manual_seed(case.seed)
    model = model_cls(config)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    weights = random_weights(shapes, case.seed, case.config["model_type"])
    model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    model = model.to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True)


def run_case(case, out_root):
    import torch

    folder = Path(out_root) / case.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    cross = {}
    if case.kind == "mlx":
        write_mlx_case(case, folder)
        cfg = json.loads((folder / "config.json").read_text())
        canon, qparams = common.dequantize_mlx_folder(folder)
        model = build_hf_model(cfg, canonical_to_hf(canon))
        bits = sorted({(p["bits"], p["group_size"]) for p in qparams.values()})
        how = (f"mlx-community layout written by mlx-lm (quantize_model + save_model + save_config, {case.bits}-bit "
               f"group {case.group_size} default, {case.dtype} scales/biases/norms/dense layers); (bits, group_size) "
               f"pairs present: {bits}. Reference = transformers on the stored values dequantized by "
               f"tools/reference/affine_pack.py (quantization keys dropped from the config)")
    else:
        write_hf_case(case, folder)
        cfg = json.loads((folder / "config.json").read_text())
        _, model_cls = hf_classes(cfg["model_type"])
        model = model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                          experts_implementation="eager").eval()
        arrays, dtypes = common.read_model_folder(folder)
        loaded = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
        via_numpy = stored_hf_to_memory(arrays)
        assert set(via_numpy) == set(loaded), sorted(set(via_numpy) ^ set(loaded))
        exact = all(np.array_equal(via_numpy[k], loaded[k]) for k in loaded)
        assert exact, "numpy-read stored values differ from transformers' loaded values"
        cross["stored_values_equal_loaded"] = exact
        cross["stored_dtypes"] = sorted(set(dtypes.values()))
        how = ("transformers save_pretrained of a bfloat16 model (per-expert tensors, transformers' default original "
               "format). Reference = from_pretrained(dtype=float32) of the folder: f32 math on the stored values")
    prompt = common.random_prompt(cfg["vocab_size"], case.prompt_len, case.seed + 7)
    logits, _ = hf_forward(model, prompt)
    greedy = hf_greedy(model, prompt, N_NEW)
    full, routers = hf_forward(model, prompt + greedy)
    cross["cached_generate_greedy_identical"] = common.hf_greedy_cached(model, prompt, N_NEW) == greedy
    if case.kind == "mlx" and case.mlx_crosscheck:
        m_logits, m_greedy = mlx_crosscheck(folder, prompt, greedy)
        cross["mlx_lm"] = common.compare(m_logits, logits)
        cross["mlx_lm"]["greedy_identical"] = m_greedy == greedy
    elif case.kind == "mlx":
        cross["mlx_lm_skipped"] = case.mlx_skip_reason
    v = common.versions()
    notes = (f"{case.desc}. {how}. {INIT_NOTE.format(seed=case.seed)} transformers {v['transformers']} / torch "
             f"{v['torch']}, fp32, attn_implementation=eager, experts_implementation=eager. greedy_ids: argmax by "
             f"full recomputation (no KV cache), EOS ({cfg.get('eos_token_id')}) not treated as a stop.")
    stab = stability_notes(full, routers, len(prompt), cfg)
    common.write_golden(folder, case.name, f"transformers {v['transformers']} / torch {v['torch']}", prompt, greedy,
                        logits, notes,
                        extra={"reference_dtype": "float32", "stability": stab, "crosscheck": cross,
                               "eos_in_greedy": cfg.get("eos_token_id") in greedy, **case.extra})
    print(f"{case.name}: {common.folder_size(folder)} bytes, prompt {len(prompt)}")
    print(f"  cross {json.dumps(cross)}")
    print(f"  stability {json.dumps(stab)}")


def main(cases):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "tests" / "golden"))
    ap.add_argument("--case", choices=[c.name for c in cases], action="append")
    args = ap.parse_args()
    for c in cases:
        if not args.case or c.name in args.case:
            run_case(c, args.out)
