#!/usr/bin/env python3
"""HuggingFace `tokenizers` encode throughput on the same text as bench/bench_tokenizer.cpp (the KJV prose records
of tests/golden/tokenizer/corpus.jsonl), for comparison with moecel's tokenizer.

  /root/venv/bin/python tools/reference/bench_tokenizer_hf.py [--text FILE] [--tokenizer FILE]... [--seconds S]

Reports the first encode (empty BPE cache), the best single-threaded encode of the whole text in one call and line
by line, and encode_batch over its lines (HF's Rayon thread pool, all cores)."""
import argparse
import json
import os
import time

import tokenizers
from tokenizers import Tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def golden_prose():
    path = os.path.join(ROOT, "tests", "golden", "tokenizer", "corpus.jsonl")
    with open(path, encoding="utf-8") as f:
        recs = [json.loads(line) for line in f]
    return "".join(r["text"] for r in recs if r["name"].startswith("prose/"))


def best_mb_per_s(nbytes, budget, fn):
    best, start = 0.0, time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        best = max(best, nbytes / 1e6 / (time.perf_counter() - t0))
        if time.perf_counter() - start >= budget:
            return best


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", help="text file (default: KJV prose of the golden corpus)")
    ap.add_argument("--tokenizer", action="append", help="tokenizer.json (default: the shared OLMoE and Qwen3 ones)")
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()
    shared = os.path.join(os.path.dirname(ROOT), "shared", "data", "tokenizers")
    paths = args.tokenizer or [os.path.join(shared, f, "tokenizer.json") for f in ("olmoe", "qwen3")]
    if args.text:
        with open(args.text, encoding="utf-8", newline="") as f:
            text = f.read()
    else:
        text = golden_prose()
    nbytes = len(text.encode("utf-8"))
    lines = text.splitlines(keepends=True)
    print(f"text: {nbytes} bytes; tokenizers {tokenizers.__version__}; {os.cpu_count()} cores")
    for path in paths:
        t0 = time.perf_counter()
        tok = Tokenizer.from_file(path)
        load = time.perf_counter() - t0
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        cold = nbytes / 1e6 / (time.perf_counter() - t0)
        warm = best_mb_per_s(nbytes, args.seconds, lambda: tok.encode(text, add_special_tokens=False))
        per_line = best_mb_per_s(nbytes, args.seconds,
                                 lambda: [tok.encode(line, add_special_tokens=False) for line in lines])
        batch = best_mb_per_s(nbytes, args.seconds, lambda: tok.encode_batch(lines, add_special_tokens=False))
        print(f"{path}\n  load {load * 1e3:.0f} ms, {len(ids)} ids")
        print(f"  encode: {cold:.1f} MB/s (first call), {warm:.1f} MB/s (best, whole text in one call), "
              f"{per_line:.1f} MB/s (best, line by line, one thread)")
        print(f"  encode_batch of {len(lines)} lines: {batch:.1f} MB/s (all cores)")


if __name__ == "__main__":
    main()
