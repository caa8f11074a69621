#!/usr/bin/env python3
"""compare.py — compares the curves of two runs' metrics.jsonl step by step.

usage: compare.py BASE/metrics.jsonl FEATURE/metrics.jsonl [--tol T] [--keys loss,lb_loss,grad_norm]

For every key and step: rel = |feature - base| / max(|base|, 1e-12). Prints the worst step of each key and
one last line, "PASS ..." when both runs have the same steps, every value is finite and every rel <= T,
else "FAIL ...". Exit status 0 on PASS, 1 on FAIL.
"""
import json
import math
import sys


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                r = json.loads(line)
                rows[r["step"]] = r
    return rows


def main(argv):
    args, tol, keys = [], 1e-4, ["loss", "lb_loss", "grad_norm"]
    i = 0
    while i < len(argv):
        if argv[i] == "--tol":
            tol, i = float(argv[i + 1]), i + 2
        elif argv[i] == "--keys":
            keys, i = argv[i + 1].split(","), i + 2
        else:
            args, i = args + [argv[i]], i + 1
    if len(args) != 2:
        sys.exit(__doc__)
    base, feat = load(args[0]), load(args[1])
    problems = []
    if sorted(base) != sorted(feat) or not base:
        problems.append(f"steps differ: base {len(base)}, feature {len(feat)}")
    steps = sorted(set(base) & set(feat))
    print(f"{'key':<12} {'worst step':>10} {'base':>14} {'feature':>14} {'rel':>10}")
    for k in keys:
        worst = (-1.0, None)
        for s in steps:
            a, b = base[s].get(k), feat[s].get(k)
            if a is None or b is None or not math.isfinite(a) or not math.isfinite(b):
                problems.append(f"{k} at step {s} is not finite (base {a}, feature {b})")
                continue
            rel = abs(b - a) / max(abs(a), 1e-12)
            if rel > worst[0]:
                worst = (rel, s)
        if worst[1] is not None:
            s = worst[1]
            print(f"{k:<12} {s:>10} {base[s][k]:>14.8g} {feat[s][k]:>14.8g} {worst[0]:>10.3g}")
            if worst[0] > tol:
                problems.append(f"{k} differs by {worst[0]:.3g} at step {s} (tolerance {tol:g})")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print(f"PASS: {len(steps)} steps, {', '.join(keys)} within rel {tol:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
