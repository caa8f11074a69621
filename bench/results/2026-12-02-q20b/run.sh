#!/usr/bin/env bash
# run.sh — q20b (issue 20) in call 2, binaries of branch q20b at 25f962d (main merged): the delta rule's bf16 bound
# from its own fp64 sensitivity (gpu_op_delta_rule, gpu_op_delta_rule_128), the Qwen3.5 model against the CPU, and
# the 8-layer Qwen3.5 step's GPU peak against its plan now that the delta rule's forward scratch and cuDNN's
# attention dQ accumulator are planned (the ops' scratch at the workspace's bottom). Run from the repository root as
# OUT=<dir> bash .dev-q20b/run.sh, the environment set up (LD_LIBRARY_PATH, PITH_TEST_GPU=1). Whole script ≤ 200 s:
# each command gets min(its limit, what is left of 195 s).
set -u
D=.dev-q20b; B=build-q20b; OUT=${OUT:-/tmp/out-q20b}; mkdir -p "$B" "$OUT"
T0=$(date +%s); S=$OUT/summary.txt; : >"$S"
for f in $D/bin/*.gz; do gunzip -c "$f" >"$B/$(basename "$f" .gz)"; chmod +x "$B/$(basename "$f" .gz)"; done
export PITH_TEST_GPU=${PITH_TEST_GPU:-1}
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader >"$OUT/gpu.txt" 2>&1
# run NAME LIMIT CMD...: the log in $OUT/NAME.txt, a summary line with rc and seconds
run() {
    local name=$1 lim=$2 left=$((195 - ($(date +%s) - T0))); shift 2
    [ "$left" -lt "$lim" ] && lim=$left
    if [ "$lim" -le 2 ]; then echo "$name: skipped (no time left)" >>"$S"; return; fi
    local t=$(date +%s)
    timeout "$lim" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: rc=$rc $(($(date +%s) - t))s (limit ${lim}s)" >>"$S"
    return $rc
}
run test_delta 120 $B/test_gpu gpu_op_delta_rule
run test_model 120 $B/test_gpu gpu_model_qwen3_5
[ -s /tmp/pith-bench-data/tokens.bin ] ||
    run synth 30 $B/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 248320 --tokens 200000 --seed 1
run train_qwen3_5 120 $B/pith train bench/qwen3_5_8l/train.json --set max_steps=4 --set benchmark=true
{
    echo "== q20b: $(($(date +%s) - T0)) s in all; $(cat "$OUT/gpu.txt")"
    cat "$S"
    grep -E "^(PASS|FAIL)|worst rel err" "$OUT/test_delta.txt" "$OUT/test_model.txt" 2>/dev/null | cut -c1-160
    grep -E "^plan \(cuda, per rank\)" "$OUT/train_qwen3_5.txt" 2>/dev/null | sed 's/.*: total/plan total/'
    grep -E "^step " "$OUT/train_qwen3_5.txt" 2>/dev/null | tail -1 | grep -oE "tokens/s [0-9,]+|gpu-peak-mem .*"
} | tee "$OUT/table.txt"
