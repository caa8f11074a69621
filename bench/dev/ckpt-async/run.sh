#!/usr/bin/env bash
# The step time a save costs (issue 38 item 4) on the 8-layer Qwen3-30B-A3B benchmark model (bench/qwen3_30b_a3b_8l),
# bf16 AdamW moments, balanced routing: one save to /dev/shm, asked for by SIGUSR1 after step K (so that no periodic
# save follows it). MODES: "true" (default) runs checkpoint.async, "false" the synchronous save (a run's setup takes
# about a minute: run them in separate calls, e.g. `MODES=false bash bench/session.sh h:NAME:240`). The async run goes
# on until its files are written (the writer renames optimizer.safetensors into .tmp-step-N) and M steps past the
# save, the synchronous one M steps past it; then each is killed (kill -9), so that no run waits for a last write.
# Prints the save's line, step_time_s and ckpt_s around it, the loop's wait for the snapshot's copies (ckpt_s of the
# step after the save less the snapshot's issue), the median step time before the save, while its files are written
# and after, the milliseconds to the first step (setup, the pinned snapshot arena included) and to the files written.
# For bench/session.sh's helper mode: copy this folder to .dev-NAME/ in the repository root (`h:NAME:240`).
set -u
OUT=${OUT:-/tmp/h/ckpt-async}; mkdir -p $OUT; S=$OUT/summary.txt; : >$S
PITH=${PITH:-build-cand/pith}; [ -x $PITH ] || PITH=build/pith
K=${K:-20}; M=${M:-16}
rm -rf /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
$PITH synth --output /tmp/pith-bench-data/tokens.bin --vocab ${VOCAB:-151936} --tokens 400000 --seed 1 >/dev/null
loc=/tmp/ck; [ $(df --output=avail -B1G /dev/shm | tail -1) -ge 50 ] && loc=/dev/shm/ck
echo "$PITH; K=$K M=$M; save_location $loc; $(df -h /dev/shm /tmp | tail -2 | tr -s ' ' | tr '\n' ';')" >>$S
ms() { echo $(( ($(date +%s%N) - t0) / 1000000 )); }
for mode in ${MODES:-true}; do
    rm -rf $loc /tmp/pith-bench-run
    t0=$(date +%s%N) first=- written=- wstep=0 log=$OUT/train_$mode.txt sent= sv=
    $PITH train ${CFG:-bench/qwen3_30b_a3b_8l/train.json} --set max_steps=1000 --set benchmark=true \
        --set optimizer.state_dtype=bf16 --set save_location=$loc --set checkpoint.async=$mode ${EXTRA:-} >$log 2>&1 &
    p=$!
    while kill -0 $p 2>/dev/null; do
        steps=$(grep -c "^step " $log)
        [ $first = - ] && [ $steps -ge 1 ] && first=$(ms)
        [ -z "$sent" ] && [ $steps -ge $K ] && kill -USR1 $p && sent=1
        [ -z "$sv" ] && sv=$(grep -om1 "^checkpoint: step [0-9]*" $log | grep -o "[0-9]*$")
        d=$(printf %08d ${sv:-0})
        [ -n "$sv" ] && [ $written = - ] && [ -e $loc/.tmp-step-$d/optimizer.safetensors -o -e $loc/step-$d ] &&
            written=$(ms) wstep=$steps
        [ -n "$sv" ] && [ $steps -ge $((sv + M)) ] && { [ $mode = false ] || [ $written != - ]; } && break
        [ $(ms) -gt ${LIMIT:-225}000 ] && { echo "async=$mode: stopped at ${LIMIT:-225} s" >>$S; break; }
        sleep 0.2
    done
    kill -9 $p 2>/dev/null; wait $p 2>/dev/null
    [ $mode = false ] && wstep=0 written=-
    echo "async=$mode: first step at $first ms, save after step ${sv:--}, files written at $written ms (step $wstep)," \
        "stopped at $(ms) ms" >>$S
    grep -E "checkpoint|plan \(host\)|error" $log | head -6 >>$S
    cp /tmp/pith-bench-run/metrics.jsonl $OUT/metrics_$mode.jsonl 2>/dev/null
    python3 - $mode ${sv:-0} $log $wstep >>$S <<'PY'
import json, re, statistics, sys
mode, K, log, W = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])  # K: the step saved
R = {r['step']: r for r in map(json.loads, open('/tmp/pith-bench-run/metrics.jsonl'))}
ms = lambda s: f"{R[s]['step_time_s'] * 1e3:.0f} ms" if s in R else "-"
ck = lambda s: f" ckpt_s {R[s]['ckpt_s']:.3f}" if 'ckpt_s' in R.get(s, {}) else ""
print(f"async={mode}: " + "; ".join(f"{s}: {ms(s)}{ck(s)}" for s in range(K - 1, K + 4)))
issue = re.search(r"snapshot in ([0-9.]+) s", open(log).read())
if issue and 'ckpt_s' in R.get(K + 1, {}):
    wait = R[K + 1]['ckpt_s'] - float(issue[1])
    print(f"async={mode}: the loop waited {wait:.3f} s for the snapshot's copies")
med = lambda a, b: statistics.median([R[s]['step_time_s'] for s in range(a, b + 1) if s in R] or [0]) * 1e3
end = max(R) if R else 0
print(f"async={mode}: median step {med(3, K):.1f} ms before the save (steps 3-{K}), " +
      (f"{med(K + 2, W):.1f} ms while its files are written (steps {K + 2}-{W}), {med(W + 1, end):.1f} ms after "
       f"(steps {W + 1}-{end})" if W else f"{med(K + 2, end):.1f} ms after it (steps {K + 2}-{end})") +
      f"; the loop's time in the save {sum(r.get('ckpt_s', 0) for r in R.values()):.3f} s")
PY
done
rm -rf $loc
cat $S
