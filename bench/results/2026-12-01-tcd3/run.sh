#!/usr/bin/env bash
# run.sh — tcd3 (issue 20) in call B: the tensor-core delta rule "v2" with U in fp32 (branch tcd3). Run from the
# repository root as OUT=<dir> bash .dev-tcd3/run.sh, the environment set up (LD_LIBRARY_PATH, PITH_TEST_GPU=1, CS).
# bin/: test_gpu and bench_gpu_ops of tcd3 (the fix), bench_gpu_ops_prev (v2 before the fix, d5bc8ab's cuda_delta.cu)
# and bench_gpu_ops_main (v1, main's cuda_delta.cu) — the peers of the timing. Whole script ≤ 200 s: each command
# gets min(its limit, what is left of 190 s).
set -u
D=.dev-tcd3; B=build-tcd3; OUT=${OUT:-/tmp/out-tcd3}; mkdir -p "$B" "$OUT"
T0=$(date +%s); S=$OUT/summary.txt; : >"$S"
for f in $D/bin/*.gz; do gunzip -c "$f" >"$B/$(basename "$f" .gz)"; chmod +x "$B/$(basename "$f" .gz)"; done
export PITH_TEST_GPU=${PITH_TEST_GPU:-1}
CS=${CS:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$OUT/gpu.txt" 2>&1
# run NAME LIMIT CMD...: the log in $OUT/NAME.txt, a summary line with rc and seconds
run() {
    local name=$1 lim=$2 left=$((190 - ($(date +%s) - T0))); shift 2
    [ "$left" -lt "$lim" ] && lim=$left
    if [ "$lim" -le 2 ]; then echo "$name: skipped (no time left)" >>"$S"; return; fi
    local t=$(date +%s)
    timeout "$lim" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: rc=$rc $(($(date +%s) - t))s (limit ${lim}s)" >>"$S"
    return $rc
}
run test_delta 40 $B/test_gpu gpu_op_delta_rule
run test_qwen3_5_op 20 $B/test_gpu gpu_op_qwen3_5
run test_qwen3_5_model 30 $B/test_gpu gpu_model_qwen3_5
run bench_fix 25 $B/bench_gpu_ops --delta
run bench_prev 20 $B/bench_gpu_ops_prev --delta
run bench_main 25 $B/bench_gpu_ops_main --delta
run memcheck 80 $CS --tool memcheck --error-exitcode 9 $B/test_gpu gpu_op_delta_rule
# racecheck on the tensor-core kernels only (the SIMT fp32 cases ran past 45 s under it before); without the
# filter option, on the head-size-128 test alone
t=$(date +%s)
run racecheck 80 $CS --tool racecheck --error-exitcode 9 --kernel-regex kns=tc_ $B/test_gpu gpu_op_delta_rule
if ! grep -q "RACECHECK SUMMARY" "$OUT/racecheck.txt" && [ $(($(date +%s) - t)) -lt 10 ]; then
    run racecheck_128 80 $CS --tool racecheck --error-exitcode 9 $B/test_gpu gpu_op_delta_rule_128
fi
{
    echo "== tcd3: $(($(date +%s) - T0)) s in all"
    for f in test_delta test_qwen3_5_op test_qwen3_5_model; do grep -hE "^(PASS|FAIL)|BF16 B 1 S 130 .* s0" "$OUT/$f.txt"; done
    grep -h "delta rule\|limit" "$OUT"/bench_*.txt | grep -v "^BENCH"
    grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT"/memcheck.txt "$OUT"/racecheck*.txt
} >>"$S" 2>/dev/null
cat "$S"
