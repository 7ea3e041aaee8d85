#!/usr/bin/env python3
"""Lays out a decode step's chain of kernels from a probe file (a -DMOECEL_CUDA_PROBE=ON build run with
MOECEL_CUDA_PROBE_OUT=FILE): for each launch of a step, when its blocks called pdl_wait() and when the waits
returned, in us from the step's first return, as medians over the steady-state steps.

Usage: probe_timeline.py FILE [--step-grid 264x1] [--skip 8]
"""
import argparse
import statistics
import struct
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--step-grid", default="", help="grid of the launch that ends a step (default: the last launch's)")
    ap.add_argument("--skip", type=int, default=8, help="steps to skip at the start (prefill, warm-up)")
    args = ap.parse_args()
    with open(args.file, "rb") as f:
        r = [(g, tc, tr, m) for g, _, _, _, tc, tr, *m in struct.iter_unpack("<IIIIQQQQQQ", f.read())]
    if not r:
        sys.exit("no records")
    r.sort(key=lambda x: x[2])
    # A launch is a run of records with one grid (every wait of a launch returns after the previous launch ended).
    launches, a = [], 0
    for b in range(1, len(r) + 1):
        if b < len(r) and r[b][0] == r[a][0]:
            continue
        s, g = r[a:b], r[a][0]
        marks = []  # per probe_mark point: percentiles 10 / 50 / 90 / 100 over the blocks, from the first return
        for i in range(4):
            v = sorted(x[3][i] - s[0][2] for x in s if x[3][i])
            marks.append([v[min(len(v) - 1, int(q * len(v)))] for q in (0.1, 0.5, 0.9, 1.0)] if v else None)
        launches.append(dict(grid=f"{g & 0xffff}x{g >> 16}", n=b - a, call_min=min(x[1] for x in s),
                             call_max=max(x[1] for x in s), ret_min=s[0][2], ret_max=s[-1][2], marks=marks))
        a = b
    step_grid = args.step_grid or launches[-1]["grid"]
    hist = {}
    for l in launches:
        hist[l["grid"]] = hist.get(l["grid"], 0) + 1
    print("launches per grid:", ", ".join(f"{g} {n}" for g, n in sorted(hist.items(), key=lambda kv: -kv[1])))
    steps, cur = [], []
    for l in launches:
        cur.append(l)
        if l["grid"] == step_grid:
            steps.append(cur)
            cur = []
    steps = steps[args.skip:-1] if len(steps) > args.skip + 1 else steps
    if not steps:
        sys.exit("no complete steps")
    shape = [l["grid"] for l in steps[-1]]
    same = [s for s in steps if [l["grid"] for l in s] == shape]
    print(f"{len(launches)} launches, {len(steps)} steps used, {len(same)} with the last step's {len(shape)} launches")
    step_us = [(same[i + 1][0]["ret_min"] - same[i][0]["ret_min"]) / 1e3 for i in range(len(same) - 1)]
    if step_us:
        print(f"step (first return to next step's first return): median {statistics.median(step_us):.1f} us")
    print("idx grid      blocks  call_min  call_max   ret_min   ret_max  phase(us: this ret_min -> next ret_min)")
    for i in range(len(shape)):
        def med(key, i=i):
            return statistics.median([(s[i][key] - s[0]["ret_min"]) / 1e3 for s in same])
        nxt = statistics.median([((s[i + 1]["ret_min"] if i + 1 < len(s) else s[i]["ret_max"]) - s[i]["ret_min"]) / 1e3
                         for s in same])
        n = int(statistics.median([s[i]["n"] for s in same]))
        print(f"{i:3d} {shape[i]:9s} {n:6d} {med('call_min'):9.2f} {med('call_max'):9.2f} {med('ret_min'):9.2f} "
              f"{med('ret_max'):9.2f} {nxt:9.2f}")
    print("probe_mark points (us after the launch's first return; 10 / 50 / 90 / max percentiles over blocks):")
    for i in range(len(shape)):
        for m in range(4):
            if all(s[i]["marks"][m] for s in same):
                q = [statistics.median(s[i]["marks"][m][j] / 1e3 for s in same) for j in range(4)]
                print(f"{i:3d} {shape[i]:9s} mark {m}: " + " / ".join(f"{v:.2f}" for v in q))
    # Per grid: total phase time per step (the same kernel in every layer).
    tot = {}
    for i in range(len(shape) - 1):
        v = statistics.median([(s[i + 1]["ret_min"] - s[i]["ret_min"]) / 1e3 for s in same])
        tot.setdefault(shape[i], []).append(v)
    print("grid      launches  sum of phases (us per step)  median phase")
    for g, v in sorted(tot.items(), key=lambda kv: -sum(kv[1])):
        print(f"{g:9s} {len(v):8d} {sum(v):12.1f} {statistics.median(v):12.2f}")


if __name__ == "__main__":
    main()
