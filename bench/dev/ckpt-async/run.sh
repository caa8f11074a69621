#!/usr/bin/env bash
# The step time a save costs (issue 38 item 4) on the 8-layer Qwen3-30B-A3B benchmark model (bench/qwen3_30b_a3b_8l),
# bf16 AdamW moments, balanced routing, a save at step K to /dev/shm (save_interval K): checkpoint.async, then
# synchronous. Each run goes on M steps after its save (the async one while its files are written) and is then killed
# (kill -9), so that no run waits for a last write; each has a time limit (90 s async, 140 s synchronous). Prints
# the save's lines (the loop's time: taking the snapshot, waiting for its copies, for the files), step_time_s and
# ckpt_s around the save, the median step time before the save and after it, and the time from the start to the
# first step (setup, the pinned snapshot arena included).
# For bench/session.sh's helper mode: copy this folder to .dev-NAME/ in the repository root (`h:NAME:240`).
set -u
OUT=${OUT:-/tmp/h/ckpt-async}; mkdir -p $OUT; S=$OUT/summary.txt; : >$S
PITH=${PITH:-build-cand/pith}; [ -x $PITH ] || PITH=build/pith
K=${K:-20}; M=${M:-16} # M < K: one save
rm -rf /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
$PITH synth --output /tmp/pith-bench-data/tokens.bin --vocab ${VOCAB:-151936} --tokens 400000 --seed 1 >/dev/null
loc=/tmp/ck; [ $(df --output=avail -B1G /dev/shm | tail -1) -ge 50 ] && loc=/dev/shm/ck
echo "$PITH; K=$K M=$M; save_location $loc; $(df -h /dev/shm /tmp | tail -2 | tr -s ' ' | tr '\n' ';')" >>$S
for mode in true false; do
    rm -rf $loc /tmp/pith-bench-run
    t0=$(date +%s%N) first= limit=$([ $mode = true ] && echo 90 || echo 140)
    $PITH train ${CFG:-bench/qwen3_30b_a3b_8l/train.json} --set max_steps=1000 --set benchmark=true \
        --set optimizer.state_dtype=bf16 --set save_location=$loc --set save_interval=$K \
        --set checkpoint.async=$mode ${EXTRA:-} >$OUT/train_$mode.txt 2>&1 &
    p=$!
    while kill -0 $p 2>/dev/null; do
        [ -z "$first" ] && grep -q "^step 00000001/" $OUT/train_$mode.txt && first=$(date +%s%N)
        grep -q "^step $(printf %08d $((K + M)))/" $OUT/train_$mode.txt && break
        (( $(date +%s%N) - t0 > limit * 10**9 )) && { echo "async=$mode: stopped at $limit s" >>$S; break; }
        sleep 0.2
    done
    kill -9 $p 2>/dev/null; wait $p 2>/dev/null
    echo "async=$mode: first step $(( (${first:-$t0} - t0) / 10**6 )) ms after the start" >>$S
    grep -E "checkpoint|plan \(host\)|error" $OUT/train_$mode.txt | head -6 >>$S
    cp /tmp/pith-bench-run/metrics.jsonl $OUT/metrics_$mode.jsonl 2>/dev/null
    python3 - $mode $K $OUT/train_$mode.txt >>$S <<'PY'
import json, re, statistics, sys
K = int(sys.argv[2])
R = {r['step']: r for r in map(json.loads, open('/tmp/pith-bench-run/metrics.jsonl'))}
ms = lambda s: f"{R[s]['step_time_s'] * 1e3:.0f} ms" if s in R else "-"
ck = lambda s: f" ckpt_s {R[s]['ckpt_s']:.3f}" if 'ckpt_s' in R.get(s, {}) else ""
print(f"async={sys.argv[1]}: " + "; ".join(f"{s}: {ms(s)}{ck(s)}" for s in range(K - 1, K + 4)))
before = [R[s]['step_time_s'] for s in range(3, K + 1) if s in R]
after = [R[s]['step_time_s'] for s in R if s > K + 1]
issue = re.search(r"snapshot in ([0-9.]+) s", open(sys.argv[3]).read())
if issue and 'ckpt_s' in R.get(K + 1, {}):
    wait = R[K + 1]['ckpt_s'] - float(issue[1])
    print(f"async={sys.argv[1]}: the loop waited {wait:.3f} s for the snapshot's copies")
if before and after:
    print(f"async={sys.argv[1]}: median step {statistics.median(before) * 1e3:.1f} ms before the save (steps 3-{K}), "
          f"{statistics.median(after) * 1e3:.1f} ms after it (steps {K + 2}-{max(R)}); the save cost the loop "
          f"{sum(R[s].get('ckpt_s', 0) for s in R):.3f} s")
PY
done
rm -rf $loc
cat $S
