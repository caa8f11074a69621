#!/usr/bin/env bash
# Issue 40 item 4: the one-rank share of Qwen3-30B-A3B at ep8 (48 layers, 16 experts a layer, micro-batch 1 × 4096)
# trains 4 steps on one H200; its GPU peak against the plan.
set -u
OUT=${OUT:-/tmp/h/plan}; mkdir -p $OUT; S=$OUT/summary.txt; : >$S
nvidia-smi --query-gpu=memory.used --format=csv,noheader | sed "s/^/GPU memory in use before: /" >>$S
rm -rf /tmp/pith-plan-data /tmp/pith-plan-run; mkdir -p /tmp/pith-plan-data
build/pith synth --output /tmp/pith-plan-data/tokens.bin --vocab 151936 --tokens 100000 --seed 1 >/dev/null
build/pith estimate .dev-plan/train.json --gpus 1 --gpu-memory 141 >$OUT/estimate.txt 2>&1; grep -E "total|verdict" $OUT/estimate.txt >>$S
for extra in ""; do
    rm -rf /tmp/pith-plan-run
    timeout 200 build/pith train .dev-plan/train.json $extra >$OUT/train.txt 2>&1; echo "train $extra rc=$?" >>$S
    grep -E "^plan|gpu-peak" $OUT/train.txt | tail -4 >>$S
    python3 - >>$S <<'PY'
import json
R = [json.loads(l) for l in open('/tmp/pith-plan-run/metrics.jsonl')]
print("steps: " + "; ".join(f"{r['step']}: {r['step_time_s']*1e3:.0f} ms, {4096/r['fwdbwd_s']:,.0f} tokens/s, gpu peak {r.get('gpu_peak_gb')} GB" for r in R))
PY
done
cat $S
