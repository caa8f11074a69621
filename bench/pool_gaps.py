#!/usr/bin/env python3
"""pool_gaps.py OUTPUT... — pools bench/run_fp8_loss.sh outputs made in several calls (disjoint SEEDS): every
per-seed line "VARIANT-SEED vs bf16-SEED, ...: last-20 train loss ... (G1%), validation ... (G2%)" except the bf16
reruns, and prints for each of the two gaps its mean ± standard error over all the seeds, with the per-seed spread."""
import math, re, statistics, sys

if len(sys.argv) < 2:
    sys.exit(__doc__.strip())
gaps, seen = [], set()
for path in sys.argv[1:]:
    for line in open(path):
        m = re.match(r"(\S+) vs (bf16-\S+?), \d+ steps: .*\(([+-][0-9.]+)%\), validation .*\(([+-][0-9.]+)%\)", line)
        if not m or m.group(1).startswith("bf16-"):
            continue
        if m.group(1) in seen:
            sys.exit(f"pool_gaps.py: {path}: {m.group(1)} appears twice (the calls' SEEDS must be disjoint)")
        seen.add(m.group(1))
        gaps.append((float(m.group(3)), float(m.group(4))))
if len(gaps) < 2:
    sys.exit(f"pool_gaps.py: {len(gaps)} per-seed line(s) in {' '.join(sys.argv[1:])}: need 2 or more")
for i, what in ((0, "last-20 train loss"), (1, "validation loss")):
    g = [x[i] for x in gaps]
    sd = statistics.stdev(g)
    print(f"{what}: over {len(g)} seeds mean gap {statistics.mean(g):+.3f}% ± {sd / math.sqrt(len(g)):.3f}% "
          f"(standard error); per seed sd {sd:.3f}%, median {statistics.median(g):+.3f}%, "
          f"range {min(g):+.3f}% to {max(g):+.3f}%, {sum(x > 0 for x in g)} above zero")
