#!/usr/bin/env bash
# The step time a save costs (issue 38 item 4): 4-layer Qwen3-30B-A3B benchmark shape, bf16 AdamW moments, saves at
# steps 5 and 10 of 10, synchronous then checkpoint.async; per-step step_time_s and ckpt_s from metrics.jsonl.
set -u
OUT=${OUT:-/tmp/h/ckpt}; mkdir -p $OUT; S=$OUT/summary.txt; : >$S
rm -rf /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
loc=/tmp/ck; [ $(df --output=avail -B1G /dev/shm | tail -1) -ge 55 ] && loc=/dev/shm/ck
echo "save_location $loc; $(df -h /dev/shm /tmp | tail -2 | tr '\n' ' ')" >>$S
for mode in false true; do
    rm -rf $loc /tmp/pith-bench-run
    timeout 240 build/pith train .dev-ckpt/train.json --set max_steps=10 --set benchmark=true \
        --set optimizer.state_dtype=bf16 --set save_location=$loc --set save_interval=5 --set checkpoint.async=$mode \
        --set run_dir=/tmp/pith-bench-run >$OUT/train_$mode.txt 2>&1
    echo "async=$mode rc=$? $(grep -c . $OUT/train_$mode.txt) lines; $(du -sh $loc 2>/dev/null | cut -f1)" >>$S
    grep -E "checkpoint|plan \(host\)" $OUT/train_$mode.txt | head -8 >>$S
    cp /tmp/pith-bench-run/metrics.jsonl $OUT/metrics_$mode.jsonl 2>/dev/null
    python3 - $mode >>$S <<'PY'
import json, sys
R = [json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]
print(f"async={sys.argv[1]}: " + "; ".join(f"{r['step']}: {r['step_time_s']*1e3:.0f} ms" + (f" ckpt {r['ckpt_s']:.2f} s" if 'ckpt_s' in r else "") for r in R))
PY
done
rm -rf $loc
cat $S
