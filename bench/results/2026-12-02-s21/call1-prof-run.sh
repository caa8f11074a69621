#!/usr/bin/env bash
# Qwen3.5 8L: per-call CUDA-event tables of main (build) and the candidate (build-cand), steps 3-6, and the delta ops.
set -u
mkdir -p /tmp/pith-bench-data
build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 248320 --tokens 200000 --seed 1 >/dev/null
for b in build build-cand; do
    timeout 50 $b/bench_gpu_ops --delta >$OUT/delta_$b.txt 2>&1; grep -v BENCH $OUT/delta_$b.txt | sed "s|^|$b delta: |"
    for n in 2 6; do
        rm -rf /tmp/pith-bench-run
        PITH_KERNEL_EVENTS=$OUT/ev-$b-$n.tsv LD_PRELOAD=.dev-prof/kernel_events.so timeout 100 $b/pith train \
            bench/qwen3_5_8l/train.json --set max_steps=$n --set tensorboard=false --set benchmark=true >$OUT/train-$b-$n.txt 2>&1
        echo "$b $n steps rc=$?"; tail -2 $OUT/train-$b-$n.txt | cut -c1-200
    done
done
python3 - $OUT <<'PY'
import sys
out = sys.argv[1]
def tab(b):
    def rd(n):
        t = {}
        for l in open(f"{out}/ev-{b}-{n}.tsv"):
            c, ms, name = l.rstrip("\n").split("\t", 2); t[name] = (int(c), float(ms))
        return t
    a, z = rd(2), rd(6)
    return {k: ((v[1] - a.get(k, (0, 0))[1]) / 4, (v[0] - a.get(k, (0, 0))[0]) / 4) for k, v in z.items()}
m, c = tab("build"), tab("build-cand")
print(f"sum main {sum(v[0] for v in m.values()):.2f} ms/step, cand {sum(v[0] for v in c.values()):.2f}")
rows = sorted(set(m) | set(c), key=lambda k: -max(m.get(k, (0, 0))[0], c.get(k, (0, 0))[0]))
print("| call | main ms | cand ms | main calls | cand calls |")
for k in rows[:60]:
    a, b = m.get(k, (0, 0)), c.get(k, (0, 0))
    print(f"| {k[:110]} | {a[0]:.3f} | {b[0]:.3f} | {a[1]:g} | {b[1]:g} |")
PY
