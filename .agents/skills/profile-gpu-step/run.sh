#!/usr/bin/env bash
# run.sh — on the GPU machine, from the repository root, .dev-agents/ carried (validate-performance/pack.sh): where
# the time of one training step goes, for the feature build.
#   1. build/bench_gpu_ops (when packed): every op alone at the Qwen3-30B-A3B layer sizes (host time over
#      back-to-back calls, the table bench/cuda_ops.md keeps) — $OUT/bench_ops.txt;
#   2. per call of a real step, from CUDA events (kernel_events.so preloaded): `pith train` on BENCH (default
#      bench/qwen3_30b_a3b_8l; natural routing, BALANCED=1 for benchmark=true; EXTRA more --set arguments) for 2 and
#      for 6 steps; the difference of the two tables / 4 is the mean of steps 3–6 per kernel, cuBLASLt shape, grouped
#      GEMM and cuDNN graph: ms per step, calls per step, share of the sum, a cuBLASLt product's TFLOP/s —
#      $OUT/step_kernels.md; under it the GPU's idle time in each of steps 3–5 of the 6-step run, its largest gaps by
#      the calls around them, and the host waits a step;
#   3. nsys (when the machine has it, under 150 s have passed and WITH_NSYS is not 0): the same 6-step run under
#      `nsys profile` and `nsys stats` of the kernels (cuda_gpu_kern_sum) — $OUT/nsys_kern_sum.txt.
# The last line is "profile-gpu-step: PASS" when the runs finished and the per-step sum of the timed calls lies
# between 50% and 150% of the step's median fwdbwd_s + optimizer time (a table that misses most of the step, or
# counts it twice, fails), else "profile-gpu-step: FAIL".
set -u
OUT=${OUT:-/tmp/pith-profile}
mkdir -p "$OUT"
. .agents/skills/validate-performance/setup.sh
bench=${BENCH:-bench/qwen3_30b_a3b_8l} t0=$(date +%s)
extra=()
[ "${BALANCED:-0}" = 1 ] && extra=(--set benchmark=true)
[ -n "${EXTRA:-}" ] && extra+=($EXTRA) # more --set KEY=VALUE arguments for every run (e.g. "--set fp8=true")
if [ -x "$BIN/feature/bench_gpu_ops" ]; then
    echo "== bench_gpu_ops"
    timeout 90 "$BIN/feature/bench_gpu_ops" >"$OUT/bench_ops.txt" 2>&1
    echo "rc=$?" >>"$OUT/bench_ops.txt"
    grep -v "^BENCH|" "$OUT/bench_ops.txt"
fi
mkdir -p /tmp/pith-bench-data
"$BIN/feature/pith" synth --output /tmp/pith-bench-data/tokens.bin --vocab "${VOCAB:-151936}" --tokens 200000 --seed 1 >/dev/null
for n in 2 6; do
    echo "== pith train, $n steps, CUDA events ($(($(date +%s) - t0)) s)"
    rm -rf /tmp/pith-bench-run
    PITH_KERNEL_EVENTS=$OUT/events-$n.tsv PITH_KERNEL_EVENTS_STEP=embedding_forward_kernel \
        LD_PRELOAD=$BIN/feature/kernel_events.so timeout 110 "$BIN/feature/pith" train \
        "$bench/train.json" --set max_steps=$n --set tensorboard=false ${extra[@]+"${extra[@]}"} >"$OUT/train-$n.txt" 2>&1
    echo "rc=$?" >>"$OUT/train-$n.txt"
    cp /tmp/pith-bench-run/metrics.jsonl "$OUT/metrics-$n.jsonl" 2>/dev/null
    grep -E "^step|error|rc=" "$OUT/train-$n.txt" | tail -2 | cut -c1-160
done
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [ "${WITH_NSYS:-1}" = 1 ] && [ -n "$NSYS" ] && [ $(($(date +%s) - t0)) -lt 150 ]; then
    echo "== nsys ($NSYS)"
    rm -rf /tmp/pith-bench-run
    timeout 120 "$NSYS" profile -o "$OUT/step" --force-overwrite true --trace cuda "$BIN/feature/pith" train \
        "$bench/train.json" --set max_steps=6 --set tensorboard=false ${extra[@]+"${extra[@]}"} >"$OUT/nsys.txt" 2>&1 &&
        timeout 60 "$NSYS" stats --report cuda_gpu_kern_sum --format table "$OUT/step.nsys-rep" >"$OUT/nsys_kern_sum.txt" 2>&1
    head -40 "$OUT/nsys_kern_sum.txt" 2>/dev/null
else
    echo "== nsys: not on this machine (or no time left); the CUDA-event table stands alone"
fi
python3 - "$OUT" <<'PY'
import json, os, re, statistics, sys
out = sys.argv[1]
def table(n):
    t = {}
    p = f"{out}/events-{n}.tsv"
    if os.path.exists(p):
        for line in open(p):
            calls, ms, name = line.rstrip("\n").split("\t", 2)
            t[name] = (int(calls), float(ms))
    return t
a, b = table(2), table(6)
ok = bool(a) and bool(b) and os.path.exists(f"{out}/metrics-6.jsonl")
rows, per = [], {}
for name, (calls, ms) in b.items():
    c0, m0 = a.get(name, (0, 0.0))
    if name.startswith("#"): per[name] = ((calls - c0) / 4, (ms - m0) / 4)
    else: rows.append(((ms - m0) / 4, (calls - c0) / 4, name))
rows.sort(reverse=True)
total = sum(r[0] for r in rows)
def rate(name, calls, ms):  # a cuBLASLt product's TFLOP/s: D m x n; A m x k or (transposed) k x m
    g = re.match(r"cublasLtMatmul D (\d+)x(\d+), A (\d+)x(\d+)$", name)
    if not g or ms <= 0: return ""
    m, n, ar, ac = map(int, g.groups())
    return f"{2 * m * n * (ac if ar == m else ar) * calls / (ms * 1e-3) / 1e12:.0f} TFLOP/s"
lines = ["| call | ms/step | calls/step | share | rate |", "|---|---:|---:|---:|---:|"]
for ms, calls, name in rows[:40]:
    share = f"{ms / total:.1%}" if total > 0 else ""
    lines.append(f"| {name} | {ms:.3f} | {calls:g} | {share} | {rate(name, calls, ms)} |")
step = None
if ok:
    R = [json.loads(l) for l in open(f"{out}/metrics-6.jsonl") if l.strip()][2:]
    step = statistics.median(r["step_time_s"] for r in R) * 1e3
    fb = statistics.median(r["fwdbwd_s"] for r in R) * 1e3
    lines.append(f"\nsum of timed calls {total:.1f} ms per step; the step (steps 3-6, events on) {step:.1f} ms, "
                 f"fwd+bwd {fb:.1f} ms; {len(rows)} distinct calls")
    win = f"{out}/events-6.tsv.windows"
    W = [[float(x) for x in l.split()] for l in open(win)] if os.path.exists(win) else []
    W = [w for w in W if 3 <= w[0] <= 5]  # steps 3-5: from one step's embedding to the next's
    if W:
        idle = [w[1] - w[2] for w in W]
        lines.append(f"GPU idle per step (steps 3-5 of one run, from each step's first kernel to the next's): "
                     + ", ".join(f"{i:.2f} ms ({i / w[1]:.2%})" for i, w in zip(idle, W)) +
                     f"; median {statistics.median(idle):.2f} ms of {statistics.median(w[1] for w in W):.1f}")
        gaps = f"{out}/events-6.tsv.gaps"
        G = [l.rstrip("\n").split("\t") for l in open(gaps)] if os.path.exists(gaps) else []
        if G:
            lines.append("largest idle gaps per step (the call before -> the call after: ms, gaps):")
            lines += [f"  {g[2]}: {float(g[0]):.3f} ms, {g[1]}" for g in G[:8]]
    elif "#gpu-busy" in per:
        busy = per["#gpu-busy"][1]
        lines.append(f"GPU idle {step - busy:.2f} ms per step ({(step - busy) / step:.2%} of the step; the difference "
                     f"of two runs: ±5 ms): some timed call was in progress for {busy:.2f} ms of it")
    if "#host-waits" in per:
        waits, wait_ms = per["#host-waits"]
        lines.append(f"host waits {waits:g} per step ({wait_ms:.2f} ms of host time)")
    ok = 0.5 * step <= total <= 1.5 * step
text = "\n".join(lines)
open(f"{out}/step_kernels.md", "w").write(text + "\n")
print(text)
print("profile-gpu-step: " + ("PASS" if ok else "FAIL"))
PY
