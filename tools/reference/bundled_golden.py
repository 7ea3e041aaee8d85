"""Golden outputs of the bundled model (models/default) from transformers' OlmoeForCausalLM.

The checkpoint's stored 4-bit values are dequantized in numpy (olmoe_ref_common / affine_pack, not MLX)
and loaded into OlmoeForCausalLM in float32 with eager attention and eager experts (TF32 off when run on
a GPU). Prompts are English text in the corpus' style, tokenized with the folder's tokenizer.json by HF
`tokenizers`. Per prompt: 64 greedy tokens (EOS not treated as a stop; full recomputation, checked equal
to generate() with the KV cache), their HF decode, and teacher-forced float32 logits of the prompt plus
the first N_LOGIT_CONT continuation tokens. train_bundled.py calls this on the GPU machine right after
the export; it runs anywhere (CPU by default, slowly: ~1300 forwards).

Writes DIR/golden.json and DIR/logits_<case>.npy. Usage (repository root):
  /root/venv/bin/python tools/reference/bundled_golden.py [--model models/default] [--out tests/golden/bundled]
      [--device cuda]
  /root/venv/bin/python tools/reference/bundled_golden.py --check tests/golden/bundled
      verify committed goldens with this machine's transformers/torch (one teacher-forced forward per case);
      add --mlx to check them with mlx-lm's loader and forward too
"""

import argparse
import json
import re
from pathlib import Path

import numpy as np

import olmoe_ref_common as common

N_NEW = 64
N_LOGIT_CONT = 8  # continuation tokens whose positions get teacher-forced logits too
PAD_ID = 1  # <|padding|>, never in a prompt

# (case name, prompt text). "<|endoftext|>" is the special token (id 0), i.e. a document start.
PROMPTS = [
    ("beginning", "In the beginning"),
    ("moses", "And the LORD said unto Moses,"),
    ("shepherd", "The LORD is my shepherd;"),
    ("blessed", "Blessed are the"),
    ("came_to_pass", "And it came to pass, when"),
    ("so_loved", "For God so loved the world,"),
    ("jesus_answered", "Jesus answered and said unto them,"),
    ("lord_of_hosts", "Thus saith the LORD of hosts;"),
    ("my_son", "My son, hear"),
    ("eos_first", "<|endoftext|>And the king said"),
]


def load_reference(model_dir, device="cpu"):
    """(config dict, fp32 OlmoeForCausalLM holding the dequantized stored values, quant params read)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 on the GPU too
    torch.backends.cudnn.allow_tf32 = False
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    canon, used = common.dequantize_mlx_folder(model_dir)
    model = common.build_hf_model(cfg, common.canonical_to_hf_fused(canon)).to(device)
    return cfg, model, used


def forward(model, ids):
    """olmoe_ref_common.hf_forward on the model's device: (logits (n, vocab), router logits per layer)."""
    import torch

    dev = next(model.parameters()).device
    with torch.no_grad():
        out = model(torch.tensor([ids], dtype=torch.long, device=dev), use_cache=False, output_router_logits=True)
    logits = out.logits[0].float().cpu().numpy()
    routers = [r.reshape(len(ids), -1).float().cpu().numpy() for r in out.router_logits]
    return logits, routers


def greedy_recompute(model, prompt, n_new):
    ids = list(prompt)
    for _ in range(n_new):
        logits, _ = forward(model, ids)
        ids.append(int(np.argmax(logits[-1])))
    return ids[len(prompt) :]


def greedy_cached(model, prompt, n_new):
    import torch

    dev = next(model.parameters()).device
    ids = torch.tensor([prompt], dtype=torch.long, device=dev)
    # An explicit all-ones mask: with pad_token_id equal to a prompt token (here <|endoftext|> = 0),
    # generate() would infer a mask that hides that token.
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_new,
            min_new_tokens=n_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=PAD_ID,
        )
    return [int(t) for t in out[0, len(prompt) :]]


def make_cases(model_dir, device="cpu", threads=None):
    import torch
    from tokenizers import Tokenizer

    if threads:
        torch.set_num_threads(threads)
    cfg, model, used = load_reference(model_dir, device)
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    eos = cfg["eos_token_id"]
    cases = []
    for name, text in PROMPTS:
        prompt = tok.encode(text).ids
        greedy = greedy_recompute(model, prompt, N_NEW)
        cached = greedy_cached(model, prompt, N_NEW)
        full_logits, routers = forward(model, prompt + greedy)
        teacher = [int(t) for t in np.argmax(full_logits[len(prompt) - 1 : -1], -1)]
        # Mismatches are recorded (and must be looked at), not fatal: the run that makes them is expensive.
        if greedy != cached or greedy != teacher:
            print(f"WARNING {name}: recomputation/cached/teacher-forced greedy differ", flush=True)
        n_logit = len(prompt) + N_LOGIT_CONT
        cases.append(
            {
                "name": name,
                "prompt_text": text,
                "prompt_ids": prompt,
                "greedy_ids": greedy,
                "greedy_text": tok.decode(greedy, skip_special_tokens=False),
                "eos_in_greedy": eos in greedy,
                "greedy_equals_generate_cached": greedy == cached,
                "greedy_equals_teacher_forced_argmax": greedy == teacher,
                "logits_file": f"logits_{name}.npy",
                "logits_ids": prompt + greedy[:N_LOGIT_CONT],
                "logits": np.ascontiguousarray(full_logits[:n_logit], dtype=np.float32),
                "stability": common.stability_notes(full_logits, routers, len(prompt), cfg["num_experts_per_tok"]),
            }
        )
        print(f"{name}: {text!r} -> {cases[-1]['greedy_text'][:100]!r}", flush=True)
    return cfg, used, cases


def check_against(model_dir, golden_dir, device="cpu"):
    """Recomputes a golden folder with this machine's transformers/torch: the prompt tokenizes the same,
    teacher-forced argmax over prompt + greedy_ids reproduces greedy_ids (what greedy decoding by full
    recomputation would give), and the stored logits rows agree."""
    from tokenizers import Tokenizer

    golden_dir = Path(golden_dir)
    g = json.loads((golden_dir / "golden.json").read_text())
    _, model, _ = load_reference(model_dir, device)
    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    ok = True
    for c in g["cases"]:
        p, gr = c["prompt_ids"], c["greedy_ids"]
        logits, _ = forward(model, p + gr)
        argmax = [int(t) for t in np.argmax(logits[len(p) - 1 : -1], -1)]
        cmp = common.compare(logits[: len(c["logits_ids"])], np.load(golden_dir / c["logits_file"]))
        same_tok = tok.encode(c["prompt_text"]).ids == p
        same_tok &= tok.decode(gr, skip_special_tokens=False) == c["greedy_text"]
        print(f"{c['name']}: tokenizer same={same_tok} greedy reproduced={argmax == gr} logits {cmp}", flush=True)
        ok &= same_tok and argmax == gr and cmp["rel_l2"] < 1e-5
    print("CHECK OK" if ok else "CHECK FAILED")
    return ok


def check_mlx(model_dir, golden_dir):
    """mlx-lm's own loader and forward (float parameters widened to f32) on the folder: teacher-forced argmax
    over prompt + greedy_ids reproduces greedy_ids, and the logits agree with the stored ones. This proves
    the export is read by MLX exactly as affine_pack.py's dequantization reads it."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import load_model

    golden_dir = Path(golden_dir)
    g = json.loads((golden_dir / "golden.json").read_text())
    model, _ = load_model(Path(model_dir))
    widen = lambda p: p.astype(mx.float32) if mx.issubdtype(p.dtype, mx.floating) else p  # noqa: E731
    model.update(tree_map(widen, model.parameters()))
    ok = True
    for c in g["cases"]:
        p, gr = c["prompt_ids"], c["greedy_ids"]
        logits = np.array(model(mx.array([p + gr]))[0])
        argmax = [int(t) for t in np.argmax(logits[len(p) - 1 : -1], -1)]
        cmp = common.compare(logits[: len(c["logits_ids"])], np.load(golden_dir / c["logits_file"]))
        print(f"mlx-lm {c['name']}: greedy reproduced={argmax == gr} logits {cmp}", flush=True)
        ok &= argmax == gr and cmp["rel_l2"] < 1e-5
    print("MLX CHECK OK" if ok else "MLX CHECK FAILED")
    return ok


def versions():
    import importlib.metadata as md
    import platform

    out = {"python": platform.python_version()}
    for p in ("transformers", "torch", "tokenizers", "numpy", "safetensors"):
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            out[p] = None
    return out


def quant_summary(used):
    """{module: {bits, group_size}} with layer indices folded into '*' (checked uniform across layers)."""
    out = {}
    for k, v in sorted(used.items()):
        key = re.sub(r"^model\.layers\.\d+\.", "model.layers.*.", k)
        assert out.setdefault(key, v) == v, f"{k}: {v} differs from other layers"
    return out


def _join_ints(m):
    return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"


def write_goldens(out_dir, model_dir, cfg, used, cases, extra=None):
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("logits_*.npy"):
        old.unlink()
    entries = []
    for c in cases:
        np.save(out_dir / c["logits_file"], c["logits"])
        e = {k: v for k, v in c.items() if k != "logits"}
        e["logits_shape"] = list(c["logits"].shape)
        entries.append(e)
    g = {
        "model": "models/default",
        "source": "transformers OlmoeForCausalLM, float32 (TF32 off), attn_implementation=eager, "
        "experts_implementation=eager, on the checkpoint's stored values dequantized by affine_pack.py",
        "tokenizer": "HF tokenizers, models/default/tokenizer.json (encode without added tokens; decode with "
        "skip_special_tokens=False)",
        "n_new": N_NEW,
        "greedy": "argmax at every step, EOS not treated as a stop, full recomputation (equal to generate() "
        "with the KV cache)",
        "logits": "logits_<name>.npy: float32, C order, shape (len(logits_ids), vocab_size); row i holds the "
        "teacher-forced logits after logits_ids[: i + 1], where logits_ids = prompt_ids + the first "
        f"{N_LOGIT_CONT} greedy_ids (one forward over logits_ids; equal to the rows of a forward over prompt + "
        "all 64 greedy ids)",
        "stability": "per case: min_greedy_top2_logit_margin over the 64 greedy steps, "
        "min_prompt_top2_logit_margin, min_router_topk_logit_gap over every token of prompt+continuation and "
        "every layer, logit_std of the prompt rows",
        "quantization_read": quant_summary(used),
        "vocab_size": cfg["vocab_size"],
        "eos_token_id": cfg["eos_token_id"],
        "cases": entries,
    }
    if extra:
        g.update(extra)
    text = json.dumps(g, indent=2)
    text = re.sub(r"\[\s*(-?\d+(?:,\s*-?\d+)*)\s*\]", _join_ints, text)
    (out_dir / "golden.json").write_text(text + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--out", default="tests/golden/bundled")
    ap.add_argument("--check", help="verify this golden folder (one forward per case) instead of writing")
    ap.add_argument("--mlx", action="store_true", help="with --check: also check with mlx-lm's loader and forward")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.check:
        ok = check_against(args.model, args.check, args.device)
        if args.mlx:
            ok &= check_mlx(args.model, args.check)
        raise SystemExit(0 if ok else 1)
    cfg, used, cases = make_cases(args.model, args.device, args.threads)
    write_goldens(args.out, args.model, cfg, used, cases, {"versions": versions(), "device": args.device})


if __name__ == "__main__":
    main()
