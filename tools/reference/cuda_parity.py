"""Whole-model parity of moecel's CUDA backend against the committed goldens (run on the GPU machine).

For every tests/golden/<family>_* case (olmoe, qwen2_moe, qwen3_moe, mixtral, dots1): `moecel logits --backend
cuda` vs the reference logits (relative L2 and argmax), and `moecel generate --backend cuda` vs the reference
greedy ids. For the bundled model: greedy ids of every golden prompt, and teacher-forced logits. Also CPU vs
CUDA logits on each case. Prints one line per check and exits non-zero on any failure.

Usage: python3 tools/reference/cuda_parity.py --moecel build/moecel [--tol 1e-4]
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {p.stderr.strip()}")
    return p.stdout


def rel_l2_rows(a, b):
    num = np.sqrt(((a.astype(np.float64) - b) ** 2).sum(axis=-1))
    den = np.sqrt((b.astype(np.float64) ** 2).sum(axis=-1))
    return num / np.maximum(den, 1e-30)


def logits(moecel, backend, model, ids, tmp):
    out = os.path.join(tmp, "l.npy")
    run([moecel, "logits", "--backend", backend, "--model", model, "--prompt-ids", ",".join(map(str, ids)),
         "--out", out])
    return np.load(out)


def greedy(moecel, backend, model, ids, n, extra=()):
    out = run([moecel, "generate", "--backend", backend, "--model", model, "--prompt-ids",
               ",".join(map(str, ids)), "--max-tokens", str(n), "--ignore-eos", "--json", *extra])
    return json.loads(out)["output_ids"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--moecel", default="build/moecel")
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--families", default="olmoe,qwen2_moe,qwen3_moe,mixtral,dots1")
    a = ap.parse_args()
    failures = 0
    tmp = tempfile.mkdtemp()

    def check(name, ok, detail):
        nonlocal failures
        failures += 0 if ok else 1
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    families = a.families.split(",")

    def check_case(case):
        g = json.load(open(os.path.join(case, "golden.json")))
        want = np.load(os.path.join(case, g.get("logits_file", "logits.npy")))
        got = logits(a.moecel, "cuda", case, g["prompt_ids"], tmp)
        cpu = logits(a.moecel, "cpu", case, g["prompt_ids"], tmp)
        r = rel_l2_rows(got, want)
        am = (got.argmax(-1) == want.argmax(-1)).mean()
        check(f"{os.path.basename(case)} logits cuda vs reference", r.max() < a.tol and am == 1.0,
              f"max rel L2 {r.max():.3g}, argmax agreement {am:.3f}")
        rc = rel_l2_rows(got, cpu)
        check(f"{os.path.basename(case)} logits cuda vs cpu", rc.max() < a.tol, f"max rel L2 {rc.max():.3g}")
        ids = greedy(a.moecel, "cuda", case, g["prompt_ids"], len(g["greedy_ids"]))
        check(f"{os.path.basename(case)} greedy cuda", ids == g["greedy_ids"],
              "identical" if ids == g["greedy_ids"] else f"first diff at {next(i for i, (x, y) in enumerate(zip(ids, g['greedy_ids'])) if x != y)}")

    for case in sorted(c for f in families for c in glob.glob(f"tests/golden/{f}_*")):
        try:
            check_case(case)
        except RuntimeError as e:  # one broken case must not hide the others
            check(f"{os.path.basename(case)}", False, str(e).splitlines()[-1][:300])

    g = json.load(open("tests/golden/bundled/golden.json"))
    for c in g["cases"]:
        want = np.load(os.path.join("tests/golden/bundled", c["logits_file"]))
        got = logits(a.moecel, "cuda", "models/default", c["logits_ids"], tmp)
        r = rel_l2_rows(got, want)
        am = (got.argmax(-1) == want.argmax(-1)).mean()
        check(f"bundled/{c['name']} logits cuda", r.max() < a.tol and am == 1.0,
              f"max rel L2 {r.max():.3g}, argmax agreement {am:.3f}")
        ids = greedy(a.moecel, "cuda", "models/default", c["prompt_ids"], len(c["greedy_ids"]))
        check(f"bundled/{c['name']} greedy cuda", ids == c["greedy_ids"], "identical" if ids == c["greedy_ids"]
              else f"differs")
        off = greedy(a.moecel, "cuda", "models/default", c["prompt_ids"], len(c["greedy_ids"]), ["--fused-moe", "off"])
        check(f"bundled/{c['name']} greedy cuda fused on == off", ids == off, "identical" if ids == off else "differs")
    print(f"{failures} failed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
