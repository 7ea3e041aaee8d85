"""Trains the bundled model (models/default): a small OLMoE-architecture model on the King James Bible.

Runs on the GPU machine (torch + transformers there). Input: the folder written by bundled_data.py
(tokenizer.json, tokenizer_config.json, train_ids.npy, val_ids.npy, corpus.json). Steps:

1. Train transformers' OlmoeForCausalLM from scratch: seeded, bf16 autocast, AdamW, warmup + cosine,
   random 512-token windows of the chapter stream, residual/embedding dropout (training only), OLMoE's
   load-balancing loss. The step count is --max-epochs worth of tokens, cut to what --time-budget allows
   (measured over the first steps); the validation loss is measured every --eval-every steps and the
   weights with the best one are kept.
2. Export in the mlx-community layout: stacked `switch_mlp` experts, every linear layer plus the
   embedding and lm_head affine-quantized 4-bit group 64 (routers `mlp.gate` 8-bit), bf16
   scales/biases/norms, `quantization` + `quantization_config` in config.json, tokenizer files.
3. Validation perplexity of the trained float32 weights and of the exported 4-bit values (dequantized,
   float32 math, TF32 off), samples from the exported model, and the goldens (bundled_golden.py, float32,
   on the same device).

Writes OUTDIR/model (the folder for models/default), OUTDIR/golden (for tests/golden/bundled) and
OUTDIR/report.json (config, arguments, loss log, validation curve, perplexities, samples, versions).

Usage (repository root; the defaults are the shipped run):
  python3 tools/reference/train_bundled.py --data .bundled_work --out OUTDIR
  python3 tools/reference/train_bundled.py --data .bundled_work --out /tmp/x --tiny --device cpu   # smoke test
"""

import argparse
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

import affine_pack
import bundled_golden
import olmoe_ref_common as common

GROUP_SIZE = 64
BITS = 4
ROUTER_BITS = 8


# ---------------------------------------------------------------------------------------------------
# config


def model_config(args, vocab_size, eos_id, pad_id):
    """config.json with HF field names (OLMoE-1B-7B's, scaled down); quantization blocks added at export."""
    return {
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "vocab_size": vocab_size,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.hidden // args.head_dim,
        "num_key_value_heads": args.hidden // args.head_dim,
        "num_experts": args.experts,
        "num_experts_per_tok": args.top_k,
        "norm_topk_prob": False,
        "hidden_act": "silu",
        "max_position_embeddings": args.max_pos,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "clip_qkv": None,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "router_aux_loss_coef": args.aux_coef,
        "output_router_logits": False,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": pad_id,
        "torch_dtype": "bfloat16",
    }


# ---------------------------------------------------------------------------------------------------
# training


def build_train_model(cfg, device, experts_impl, dropout):
    import torch
    import torch.nn.functional as F
    from transformers import OlmoeConfig, OlmoeForCausalLM

    config = OlmoeConfig.from_dict(common.hf_config_for_transformers(cfg))
    model = OlmoeForCausalLM._from_config(
        config, attn_implementation="sdpa", experts_implementation=experts_impl, dtype=torch.float32
    ).to(device)

    # Dropout on the embedding output and on each attention / MoE branch before the residual add: the
    # corpus is ~1M tokens, so without it the model memorizes. Hooks act only in training mode.
    def drop(module, inputs, output):
        if not module.training or dropout == 0:
            return output
        if isinstance(output, tuple):
            return (F.dropout(output[0], dropout, True),) + tuple(output[1:])
        return F.dropout(output, dropout, True)

    model.model.embed_tokens.register_forward_hook(drop)
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(drop)
        layer.mlp.register_forward_hook(drop)
    return model


def lm_loss(model, x, autocast_dtype, device_type, with_aux):
    """Mean next-token cross entropy over x[:, 1:] (float32 softmax) and the load-balancing loss."""
    import torch
    import torch.nn.functional as F

    with torch.autocast(device_type=device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        out = model(input_ids=x[:, :-1], output_router_logits=with_aux, use_cache=False)
    logits = out.logits.float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="mean")
    return ce, (out.aux_loss if with_aux else None)


def eval_nll(model, ids, seq, device, autocast_dtype=None, batch=64):
    """Mean NLL (nats/token) over a token stream cut into non-overlapping windows of seq targets."""
    import torch

    ids = np.asarray(ids, dtype=np.int64)
    starts = list(range(0, len(ids) - 1, seq))
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        windows = [ids[s : s + seq + 1] for s in starts]
        full = [w for w in windows if len(w) == seq + 1]
        rest = [w for w in windows if 1 < len(w) < seq + 1]
        for i in range(0, len(full), batch):
            x = torch.from_numpy(np.stack(full[i : i + batch])).to(device)
            ce, _ = lm_loss(model, x, autocast_dtype, device.type, False)
            n = x[:, 1:].numel()
            total, count = total + float(ce) * n, count + n
        for w in rest:
            x = torch.from_numpy(w[None]).to(device)
            ce, _ = lm_loss(model, x, autocast_dtype, device.type, False)
            total, count = total + float(ce) * (len(w) - 1), count + len(w) - 1
    model.train(was_training)
    return total / count


def lr_at(step, total, peak, warmup, final_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def train(args, cfg, train_ids, val_ids, device):
    import torch

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    autocast_dtype = torch.bfloat16 if args.bf16 else None
    train_t = torch.from_numpy(train_ids.astype(np.int64)).to(device)
    offs = torch.arange(args.seq + 1, device=device)

    def batch():
        starts = torch.from_numpy(rng.integers(0, len(train_ids) - args.seq - 1, size=args.batch)).to(device)
        return train_t[starts[:, None] + offs]

    # grouped_mm experts are much faster on the GPU; fall back to eager where they do not run.
    impls = [args.experts_impl] if args.experts_impl != "auto" else ["grouped_mm", "eager"]
    for impl in impls:
        torch.manual_seed(args.seed)
        model = build_train_model(cfg, device, impl, args.dropout)
        try:
            ce, aux = lm_loss(model, batch()[:2], autocast_dtype, device.type, True)
            (ce + cfg["router_aux_loss_coef"] * aux).backward()
            model.zero_grad(set_to_none=True)
            break
        except Exception as e:  # noqa: BLE001 - any failure of the fast path means: use the next one
            print(f"experts_implementation={impl} failed: {type(e).__name__}: {e}", flush=True)
    else:
        raise RuntimeError("no experts implementation ran")
    print(f"experts_implementation={impl}", flush=True)
    rng = np.random.default_rng(args.seed)  # the probe batch above does not shift the data order
    torch.manual_seed(args.seed)

    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    cap = max(args.warmup + 10, int(args.max_epochs * len(train_ids) / (args.batch * args.seq)))
    total = args.steps if args.steps > 0 else cap
    log, evals = [], []
    best = (float("inf"), -1, None)
    model.train()
    t0 = time.time()
    step = 0
    measured_at = min(30, args.warmup)
    while step < total:
        lr = lr_at(step, total, args.lr, args.warmup, args.final_lr_frac)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch()
        ce, aux = lm_loss(model, x, autocast_dtype, device.type, True)
        loss = ce + cfg["router_aux_loss_coef"] * aux
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if step == measured_at and args.steps <= 0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            per_step = (time.time() - t0) / step
            total = min(cap, max(args.warmup + 10, int(args.time_budget / per_step)))
            print(f"{per_step * 1000:.1f} ms/step -> {total} steps (epoch cap {cap})", flush=True)
        if step % args.log_every == 0 or step == total:
            rec = {"step": step, "lr": lr, "loss": float(ce), "aux": float(aux), "grad_norm": gnorm.item(),
                   "time_s": round(time.time() - t0, 1)}
            log.append(rec)
            print(json.dumps(rec), flush=True)
        if step % args.eval_every == 0 or step == total:
            v = eval_nll(model, val_ids, args.seq, device, autocast_dtype)
            evals.append({"step": step, "val_loss": v, "val_ppl": math.exp(v), "time_s": round(time.time() - t0, 1)})
            print(json.dumps(evals[-1]), flush=True)
            if v < best[0]:
                best = (v, step, {k: t.detach().clone() for k, t in model.state_dict().items()})
        if time.time() - t0 > args.time_budget * 1.15 and step < total:
            print(f"time guard: stopping at step {step}", flush=True)
            if not evals or evals[-1]["step"] != step:
                v = eval_nll(model, val_ids, args.seq, device, autocast_dtype)
                t = round(time.time() - t0, 1)
                evals.append({"step": step, "val_loss": v, "val_ppl": math.exp(v), "time_s": t})
                if v < best[0]:
                    best = (v, step, {k: t.detach().clone() for k, t in model.state_dict().items()})
            break
    train_time = time.time() - t0
    model.load_state_dict(best[2])
    model.eval()
    info = {
        "params": n_params,
        "experts_implementation": impl,
        "steps_run": step,
        "steps_planned": total,
        "step_cap_from_max_epochs": cap,
        "best_step": best[1],
        "tokens_per_step": args.batch * args.seq,
        "tokens_seen": step * args.batch * args.seq,
        "epochs_seen": step * args.batch * args.seq / len(train_ids),
        "epochs_at_best": best[1] * args.batch * args.seq / len(train_ids),
        "train_time_s": round(train_time, 1),
        "log": log,
        "evals": evals,
    }
    return model, info


# ---------------------------------------------------------------------------------------------------
# export: mlx-community layout, affine 4-bit group 64, bf16 scales/biases/norms


def f32_to_bf16_bits(x):
    """float32 -> bf16 bit patterns (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    assert np.isfinite(x).all()
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def quantize_bf16(w, bits, group_size):
    """affine_pack.quantize's min/max scheme with scales/biases stored as bf16 (returned as bit patterns);
    the integers are chosen against the rounded scales/biases, so the stored triple is the model's truth."""
    w = np.asarray(w, dtype=np.float32)
    n = w.shape[-1]
    assert n % group_size == 0
    g = w.reshape(*w.shape[:-1], n // group_size, group_size)
    lo, hi = g.min(-1), g.max(-1)
    levels = (1 << bits) - 1
    s_bits = f32_to_bf16_bits(np.maximum((hi - lo) / levels, 1e-8))
    b_bits = f32_to_bf16_bits(lo)
    scales, biases = bf16_bits_to_f32(s_bits), bf16_bits_to_f32(b_bits)
    q = np.clip(np.rint((g - biases[..., None]) / scales[..., None]), 0, levels).astype(np.uint32)
    return affine_pack.pack(q.reshape(w.shape), bits), s_bits, b_bits


def hf_fused_to_canonical(sd, n_layers):
    """transformers 5.x in-memory state dict (numpy f32) -> canonical mlx-lm names with stacked experts."""
    out = {}
    for k, v in sd.items():
        if ".mlp.experts." in k:
            continue
        out[k] = v
    for L in range(n_layers):
        p = f"model.layers.{L}.mlp"
        gu = sd[f"{p}.experts.gate_up_proj"]  # (E, 2F, H), gate rows first
        f = gu.shape[1] // 2
        out[f"{p}.switch_mlp.gate_proj.weight"] = gu[:, :f]
        out[f"{p}.switch_mlp.up_proj.weight"] = gu[:, f:]
        out[f"{p}.switch_mlp.down_proj.weight"] = sd[f"{p}.experts.down_proj"]  # (E, H, F)
    return out


def write_safetensors(path, tensors, metadata):
    """tensors: name -> (dtype string, numpy array holding that dtype's bytes). Sorted names, 8-byte
    aligned header, as the safetensors library writes."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dt, a = tensors[name]
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps({"__metadata__": metadata, **header}, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)


def export(model, cfg, data_dir, out_dir):
    """Writes the mlx-community-layout folder; returns the dequantized canonical weights (what it holds)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().float().cpu().numpy() for k, v in model.state_dict().items()}
    canon = hf_fused_to_canonical(sd, cfg["num_hidden_layers"])
    tensors, overrides = {}, {}
    for name, w in canon.items():
        assert name.endswith(".weight"), name
        if w.ndim == 1:  # RMSNorm weights (input/post-attention, q_norm, k_norm, final norm)
            tensors[name] = ("BF16", f32_to_bf16_bits(w))
            continue
        prefix = name[: -len(".weight")]
        bits = ROUTER_BITS if prefix.endswith(".mlp.gate") else BITS
        if bits != BITS:
            overrides[prefix] = {"group_size": GROUP_SIZE, "bits": bits, "mode": "affine"}
        q, s, b = quantize_bf16(w, bits, GROUP_SIZE)
        tensors[f"{prefix}.weight"] = ("U32", q)
        tensors[f"{prefix}.scales"] = ("BF16", s)
        tensors[f"{prefix}.biases"] = ("BF16", b)
    write_safetensors(out_dir / "model.safetensors", tensors, {"format": "mlx"})
    quant = {"group_size": GROUP_SIZE, "bits": BITS, "mode": "affine", **overrides}
    full = dict(cfg)
    full["quantization"] = quant
    full["quantization_config"] = dict(quant)
    (out_dir / "config.json").write_text(json.dumps(full, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(data_dir) / f, out_dir / f)
    deq, used = common.dequantize_mlx_folder(out_dir)
    assert set(deq) == set(canon)
    return deq


def verify_with_safetensors_lib(path):
    """The official safetensors reader agrees with the numpy reader on every tensor."""
    import torch
    from safetensors import safe_open

    ours, dtypes, meta = common.read_safetensors(path)
    assert meta == {"format": "mlx"}
    with safe_open(str(path), framework="pt") as f:
        assert sorted(f.keys()) == sorted(ours)
        for k in f.keys():
            t = f.get_tensor(k)
            ref = t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()
            assert np.array_equal(ref.view(np.uint32) if dtypes[k] == "U32" else ref, ours[k]), k


def load_canonical_into(model, canon):
    import torch

    sd = common.canonical_to_hf_fused(canon)
    sd = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in sd.items()}
    missing, unexpected = model.load_state_dict(sd, strict=True)
    assert not missing and not unexpected


# ---------------------------------------------------------------------------------------------------
# samples


SAMPLE_PROMPTS = ["In the beginning", "And the LORD spake unto Moses, saying,", "Blessed are the poor in spirit:",
                  "The LORD is my shepherd;", "And Jesus said unto them,"]


def samples(model, tok, device, n_new=64, seed=1234):
    import torch

    out = []
    for text in SAMPLE_PROMPTS:
        ids = torch.tensor([tok.encode(text).ids], device=device)
        with torch.no_grad():
            g = model.generate(ids, max_new_tokens=n_new, do_sample=False, eos_token_id=None, pad_token_id=1)
            torch.manual_seed(seed)
            s = model.generate(ids, max_new_tokens=n_new, do_sample=True, temperature=0.8, top_p=0.95, top_k=0,
                               eos_token_id=None, pad_token_id=1)
        out.append({
            "prompt": text,
            "greedy": tok.decode(g[0, ids.shape[1]:].tolist(), skip_special_tokens=False),
            "sampled_t0.8_p0.95": tok.decode(s[0, ids.shape[1]:].tolist(), skip_special_tokens=False),
        })
        print(json.dumps(out[-1]), flush=True)
    return out


# ---------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".bundled_work")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny model and few steps (CPU smoke test)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--max-pos", type=int, default=1024)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=0, help="0: as many as --time-budget allows")
    ap.add_argument("--time-budget", type=float, default=240.0, help="seconds of training when --steps 0")
    ap.add_argument("--max-epochs", type=float, default=12.0, help="step cap when --steps 0")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--final-lr-frac", type=float, default=0.1)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--experts-impl", default="auto")
    ap.add_argument("--no-bf16", dest="bf16", action="store_false")
    ap.add_argument("--golden-threads", type=int, default=0)
    args = ap.parse_args()
    if args.tiny:
        args.hidden, args.layers, args.experts, args.intermediate = 64, 2, 8, 64
        args.seq, args.batch, args.steps, args.warmup = 64, 4, 12, 4
        args.eval_every, args.log_every = 6, 3

    import torch
    from tokenizers import Tokenizer

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 evaluation means float32
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    data, out = Path(args.data), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(data / "tokenizer.json"))
    corpus = json.loads((data / "corpus.json").read_text())
    train_ids, val_ids = np.load(data / "train_ids.npy"), np.load(data / "val_ids.npy")
    if args.tiny:
        val_ids = val_ids[:300]
    cfg = model_config(args, tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|padding|>"))
    t_start = time.time()

    model, info = train(args, cfg, train_ids, val_ids, device)
    model = model.float()
    fp32_val = eval_nll(model, val_ids, args.seq, device)
    fp32_train = eval_nll(model, train_ids[: 64 * args.seq + 1], args.seq, device)
    print(f"fp32: val ppl {math.exp(fp32_val):.3f}, train ppl (first 64 windows) {math.exp(fp32_train):.3f}",
          flush=True)

    model_dir = out / "model"
    deq = export(model, cfg, data, model_dir)
    verify_with_safetensors_lib(model_dir / "model.safetensors")
    load_canonical_into(model, {k: v for k, v in deq.items()})
    q4_val = eval_nll(model, val_ids, args.seq, device)
    q4_train = eval_nll(model, train_ids[: 64 * args.seq + 1], args.seq, device)
    print(f"4-bit: val ppl {math.exp(q4_val):.3f}, train ppl {math.exp(q4_train):.3f}", flush=True)
    smp = samples(model, tok, device)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()

    t_gold = time.time()
    g_cfg, used, cases = bundled_golden.make_cases(model_dir, args.device, args.golden_threads or None)
    gdev = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    bundled_golden.write_goldens(out / "golden", model_dir, g_cfg, used, cases,
                                 {"versions": bundled_golden.versions(), "device": gdev})
    report = {
        "config": cfg,
        "args": vars(args),
        "corpus": {k: v for k, v in corpus.items() if k != "val_chapters"},
        "val_chapters": corpus["val_chapters"],
        "val_loss_fp32": fp32_val,
        "val_ppl_fp32": math.exp(fp32_val),
        "val_loss_q4": q4_val,
        "val_ppl_q4": math.exp(q4_val),
        "train_ppl_fp32_first64": math.exp(fp32_train),
        "train_ppl_q4_first64": math.exp(q4_train),
        "model_bytes": common.folder_size(model_dir),
        "golden_time_s": round(time.time() - t_gold, 1),
        "total_time_s": round(time.time() - t_start, 1),
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "versions": bundled_golden.versions(),
        "samples": smp,
        **info,
    }
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k not in ("log", "evals", "samples", "args", "val_chapters")},
                     indent=1), flush=True)


if __name__ == "__main__":
    main()
