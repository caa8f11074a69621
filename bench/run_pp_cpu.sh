#!/usr/bin/env bash
# run_pp_cpu.sh — per-step time of one pipeline layout after another on CPU ranks: pp 1, 2 and 4 (ranks =
# pp, dp = ep = 1) on bench/pp_tiny (Qwen3-MoE, 8 layers, the first dense; global batch 32 × 64 tokens, so
# one pipeline runs 16 micro-batches of 2 sequences per step). Plumbing only: CPU ranks share this
# machine's cores with each other (and with whatever else runs), so the table is no speed claim.
# Then the bubble of one pp2 step with a 30 ms sleep in every compute (PITH_TEST_PIPE_DELAY) of every rank, and
# of rank 1 alone: the sleeps dominate, so a slow rank 1 shows as rank 0's wait (the second bubble is the larger).
#   bash bench/run_pp_cpu.sh [STEPS]   (from the repository root; PITH=… overrides build/pith, OUT=… the logs)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pith=${PITH:-$root/build/pith}
out=${OUT:-/tmp/pith-bench-pp}
steps=${1:-10}
mkdir -p "$out"
cp "$root/bench/pp_tiny/model.json" "$root/bench/pp_tiny/train.json" "$out/"
[ -f "$out/data.bin" ] || "$pith" synth --output "$out/data.bin" --vocab 256 --tokens 200000 >/dev/null
for pp in 1 2 4; do
    rm -rf "$out/pp$pp"
    PITH=$pith "$root/scripts/launch.sh" -n "$pp" "$out/train.json" --set parallel.pipeline_parallel_size=$pp \
        --set max_steps="$steps" --set run_dir="$out/pp$pp" >"$out/pp$pp.log" 2>&1
done
python3 - "$out" "$steps" <<'PY'
import json, statistics, sys
out, steps = sys.argv[1], int(sys.argv[2])
print(f"| layout | ranks | step time (median of steps 3..{steps}) | forward+backward | loss at step {steps} |")
print("|---|---:|---:|---:|---:|")
for pp in (1, 2, 4):
    rows = [json.loads(l) for l in open(f"{out}/pp{pp}/metrics.jsonl")]
    late = [r for r in rows if r["step"] >= 3]
    st = statistics.median(r["step_time_s"] for r in late)
    fb = statistics.median(r["fwdbwd_s"] for r in late)
    print(f"| pp{pp} | {pp} | {st * 1000:.1f} ms | {fb * 1000:.1f} ms | {rows[-1]['loss']:.6f} |")
PY
for delay in -1:30000 1:30000; do
    rm -rf "$out/delay"
    PITH_TEST_PIPE_DELAY=$delay PITH=$pith "$root/scripts/launch.sh" -n 2 "$out/train.json" \
        --set parallel.pipeline_parallel_size=2 --set max_steps=1 --set run_dir="$out/delay" >"$out/delay.log" 2>&1
    python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); print(f'pp2, 30 ms sleep on rank(s) {sys.argv[2]}: bubble {r[\"bubble\"]:.3f}')" \
        "$out/delay/metrics.jsonl" "$delay"
done
