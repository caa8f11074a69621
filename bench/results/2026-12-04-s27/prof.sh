#!/usr/bin/env bash
# .dev-prof/run.sh — 6 steps of pith train (balanced) per family in FAMS under kernel_events.so built from this tree
# (its reader thread): per-step windows, the idle gaps, the kernel table; then the same runs without events.
set -u
BIN=${PBIN:-build-cand}
[ -d /tmp/san ] && for i in $(seq 240); do [ -e /tmp/san.done ] && break; sleep 1; done # the sanitizers first (.dev-san)
[ -d /tmp/san ] && cp -r /tmp/san $OUT/ && cat /tmp/san/summary.txt
gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o /tmp/ke.so .agents/skills/profile-gpu-step/kernel_events.c -ldl -lpthread || exit 1
declare -A dir=([qwen3]=bench/qwen3_30b_a3b_8l [gpt_oss]=bench/gpt_oss_20b_4l [qwen3_5]=bench/qwen3_5_8l [dsv2]=bench/deepseek_v2_lite_8l)
declare -A vocab=([qwen3]=151936 [gpt_oss]=201088 [qwen3_5]=248320 [dsv2]=102400)
for f in ${FAMS:-qwen3}; do
    rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data $OUT/$f
    $BIN/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab ${vocab[$f]} --tokens 200000 --seed 1 >/dev/null
    PITH_KERNEL_EVENTS=$OUT/$f/events.tsv PITH_KERNEL_EVENTS_STEP=embedding_forward_kernel LD_PRELOAD=/tmp/ke.so \
        timeout 120 $BIN/pith train ${dir[$f]}/train.json --set max_steps=6 --set benchmark=true --set tensorboard=false \
        >$OUT/$f/train.txt 2>&1
    echo "$f rc=$?"
    cp /tmp/pith-bench-run/metrics.jsonl $OUT/$f/ 2>/dev/null
    echo "$f windows (step, ms, busy ms):"; cat $OUT/$f/events.tsv.windows
    echo "$f gaps:"; head -8 $OUT/$f/events.tsv.gaps
    grep "#" $OUT/$f/events.tsv
    python3 - $OUT/$f/metrics.jsonl <<'PY'
import json, sys
R = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("steps (fwdbwd, step ms):", [(round(r['fwdbwd_s']*1e3, 1), round(r['step_time_s']*1e3, 1)) for r in R])
PY
done
