#!/usr/bin/env bash
# run.sh — fp8g (issue 22) in call B: the experts' FP8 forward, input and weight gradient on the wgmma E4M3 kernel
# (cuda_wgmma_fp8.cu, branch fp8g). Run from the repository root as OUT=<dir> bash .dev-fp8g/run.sh, the environment
# set up (LD_LIBRARY_PATH, PITH_TEST_GPU=1, CS). Whole script ≤ 148 s: each command gets min(its limit, what is left).
# Order: the FP8 op tests (grouped kernel against the CPU emulation), the --fp8 bench (FP8/bf16 ratios), the model
# test, the 8-layer Qwen3 benchmark in FP8 and bf16 (6 steps, ≈ 28 s each in call B2) if ≥ 60 s are left, then
# memcheck on the grouped test with what is left.
set -u
D=.dev-fp8g; B=build-fp8g; OUT=${OUT:-/tmp/out-fp8g}; mkdir -p "$B" "$OUT"
T0=$(date +%s); S=$OUT/summary.txt; : >"$S"
for f in $D/bin/*.gz; do gunzip -c "$f" >"$B/$(basename "$f" .gz)"; chmod +x "$B/$(basename "$f" .gz)"; done
export PITH_TEST_GPU=${PITH_TEST_GPU:-1} PITH_BIN=$B/pith
CS=${CS:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
LIMIT=143
# run NAME LIMIT CMD...: output appended to $OUT/NAME.txt, a summary line with rc and seconds
run() {
    local name=$1 lim=$2 left=$((LIMIT - ($(date +%s) - T0))); shift 2
    [ "$left" -lt "$lim" ] && lim=$left
    if [ "$lim" -le 2 ]; then echo "$name: skipped (no time left)" >>"$S"; return 1; fi
    local t=$(date +%s)
    echo "== $* (limit ${lim}s)" >>"$OUT/$name.txt"
    timeout "$lim" "$@" >>"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: rc=$rc $(($(date +%s) - t))s (limit ${lim}s): $*" >>"$S"
    return $rc
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$OUT/tests.txt" 2>&1
run tests 30 $B/test_gpu gpu_op_fp8
run bench 25 $B/bench_gpu_ops --fp8
run tests 25 $B/test_gpu gpu_model_fp8
if [ $((LIMIT - ($(date +%s) - T0))) -ge 60 ]; then
    run train 10 $B/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1
    for v in fp8 bf16; do
        set8=""; [ $v = fp8 ] && set8="--set fp8=true"
        run train 35 $B/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=6 --set benchmark=true $set8 \
            --set run_dir=/tmp/pith-bench-run-$v
        { echo "== metrics $v"; cat /tmp/pith-bench-run-$v/metrics.jsonl; } >>"$OUT/train.txt" 2>&1
    done
else
    echo "train: skipped ($((LIMIT - ($(date +%s) - T0))) s left < 60)" >>"$S"
fi
run memcheck 60 $CS --tool memcheck --error-exitcode 9 $B/test_gpu gpu_op_fp8_grouped
{
    echo "== fp8g: $(($(date +%s) - T0)) s in all"
    grep -hE "^(PASS|FAIL)|grouped M|dense M|internal error|worst" "$OUT/tests.txt"
    grep -h "FP8/bf16\|tensor cores\|codes\|internal error" "$OUT/bench.txt"
    grep -h "ERROR SUMMARY" "$OUT/memcheck.txt"
    for v in fp8 bf16; do
        echo "train $v fwdbwd_s: $(grep -o '"fwdbwd_s": *[0-9.e+-]*' /tmp/pith-bench-run-$v/metrics.jsonl 2>/dev/null | tr '\n' ' ')"
    done
} >>"$S" 2>/dev/null
cat "$S"
