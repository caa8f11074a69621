#!/usr/bin/env bash
# run_recompute.sh — the memory levers on one GPU, from the repository root (docs/architecture.md,
# "Activation recomputation"): `pith train` on bench/qwen3_30b_a3b_8l (Qwen3-30B-A3B cut to 8 layers,
# 2 × 4096 tokens, bf16, natural routing) under recompute none, selective and full; per mode the median
# fwd+bwd tokens/s over steps ≥ 3, the GPU peak and the plan (the step line's "gpu-peak-mem … (plan …)"),
# peak/plan − 1, each mode's step time against none and the optimizer step; a fourth run, `offload`, is
# recompute none with optimizer.offload (AdamW's moments on the host: the optimizer column is its cost); then `pith estimate --sweep` for the 48-layer
# Qwen3-30B-A3B on 8 × 80 GB and 8 × 141 GB. Logs and the table under $OUT (default /tmp/pith-recompute).
# Options: --steps=N (default 8); --config=PATH and --device=cpu run the same on another config (a CPU dry run:
#   bash bench/run_recompute.sh --config=examples/tiny/train.json --device=cpu --steps=4); --modes="none gate_up …"
#   (recompute values, `offload` as above; the first is the baseline) and --no-sweep; RUN_T: each run's timeout (420 s).
set -u
OUT=${OUT:-/tmp/pith-recompute}
steps=8 config=bench/qwen3_30b_a3b_8l/train.json device=cuda vocab=151936 modes="none selective full offload" sweep=1
for a in "$@"; do
    case "$a" in --steps=*) steps=${a#--steps=} ;; --config=*) config=${a#--config=} ;; --device=*) device=${a#--device=} ;;
    --modes=*) modes=${a#--modes=} ;; --no-sweep) sweep=0 ;; esac
done
mkdir -p "$OUT"
pith=${PITH:-build/pith}
[ -x "$pith" ] || make -j16 GPU=1 build/pith >"$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
if [ "$config" = bench/qwen3_30b_a3b_8l/train.json ]; then
    mkdir -p /tmp/pith-bench-data
    "$pith" synth --output /tmp/pith-bench-data/tokens.bin --vocab $vocab --tokens 200000 --seed 1 >/dev/null
fi
date -u +"%Y-%m-%d %H:%M UTC"
for mode in $modes; do
    rm -rf "$OUT/run-$mode"
    r=$mode x=()
    [ $mode = offload ] && r=none x=(--set optimizer.offload=true)
    timeout ${RUN_T:-420} "$pith" train "$config" --set max_steps="$steps" --set recompute=$r --set device=$device \
        --set run_dir="$OUT/run-$mode" --set tensorboard=false "${x[@]}" >"$OUT/train-$mode.txt" 2>&1
    echo "rc=$?" >>"$OUT/train-$mode.txt"
    grep -v '^{' "$OUT/train-$mode.txt" | tail -2
done
python3 - "$OUT" $modes <<'PY' | tee "$OUT/table.md"
import json, re, statistics, sys
out = sys.argv[1]
rows, base = [], None
for mode in sys.argv[2:]:
    text = open(f"{out}/train-{mode}.txt").read()
    m = [json.loads(l) for l in open(f"{out}/run-{mode}/metrics.jsonl")] if "rc=0" in text else []
    plan = re.search(r"total [0-9.]+ MB \(([0-9]+) bytes\)", text)
    gpu = re.findall(r"gpu-peak-mem ([0-9.]+) GB \(plan ([0-9.]+) GB\)", text)
    if not m or not plan:
        rows.append(f"| {mode} | failed (see train-{mode}.txt) | | | | | |"); continue
    fb = statistics.median(r["fwdbwd_s"] for r in m[2:] or m)
    tps = statistics.median(r["tokens_per_s"] * r["step_time_s"] / r["fwdbwd_s"] for r in m[2:] or m)
    base = base or fb
    opt = statistics.median(r["step_time_s"] - r["fwdbwd_s"] for r in m[2:] or m)
    peak, planned = (float(gpu[-1][0]), float(gpu[-1][1])) if gpu else (float("nan"), int(plan.group(1)) / 1e9)
    rows.append(f"| {mode} | {tps:,.0f} | {fb * 1e3:.1f} ms ({100 * (fb / base - 1):+.1f}%) | {peak:.2f} GB | "
                f"{planned:.2f} GB | {100 * (peak / planned - 1):+.2f}% | {opt * 1e3:.1f} ms |")
print("| recompute | fwd+bwd tokens/s | fwd+bwd (vs none) | GPU peak | plan | peak vs plan | optimizer |")
print("|---|---:|---:|---:|---:|---:|---:|")
print("\n".join(rows))
PY
for gb in 80 141; do
    [ $sweep = 1 ] || break
    echo "== pith estimate examples/qwen3-30b-a3b/train.json --gpus 8 --gpu-memory $gb --sweep"
    "$pith" estimate examples/qwen3-30b-a3b/train.json --gpus 8 --gpu-memory $gb --sweep | grep -A7 '^sweep:' | tee -a "$OUT/table.md"
done
