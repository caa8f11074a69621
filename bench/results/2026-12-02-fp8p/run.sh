#!/usr/bin/env bash
# run.sh — fp8p (issue 22): the dense projections (attention q/k/v/o) on the FP8 path beside the experts (branch fp8p).
# Run from the repository root as OUT=<dir> bash .dev-fp8p/run.sh, the environment set up (LD_LIBRARY_PATH,
# PITH_TEST_GPU=1). Whole script ≤ 148 s: each command gets min(its limit, what is left). Order: gpu_model_fp8 (FP8
# against bf16, now with the projections in FP8, and a biased pair), gpu_op_fp8 (the lead's op tests, unchanged
# kernels), the bias ops' GPU tests, then the 8-layer Qwen3 benchmark in bf16 and FP8 (6 steps each, one after the
# other: 113 GB each).
set -u
D=.dev-fp8p; B=build-fp8p; OUT=${OUT:-/tmp/out-fp8p}; mkdir -p "$B" "$OUT"
T0=$(date +%s); S=$OUT/summary.txt; : >"$S"
for f in $D/bin/*.gz; do gunzip -c "$f" >"$B/$(basename "$f" .gz)"; chmod +x "$B/$(basename "$f" .gz)"; done
export PITH_TEST_GPU=${PITH_TEST_GPU:-1} PITH_BIN=$B/pith
LIMIT=146
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
run tests 60 $B/test_gpu gpu_model_fp8
run tests 60 $B/test_gpu gpu_op_fp8
# the bias kernels now called through cuda_linear_bias_forward/_backward (dense and per expert): GPU against CPU
run tests 20 $B/test_gpu gpu_op_linear
run tests 20 $B/test_gpu gpu_op_grouped_linear_bias
run tests 20 $B/test_gpu gpu_model_gpt_oss
mkdir -p /tmp/pith-bench-data
run train 10 $B/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1
for v in bf16 fp8; do
    set8=""; [ $v = fp8 ] && set8="--set fp8=true"
    rm -rf /tmp/pith-bench-run-$v
    run train_$v 60 $B/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=6 --set benchmark=true $set8 \
        --set run_dir=/tmp/pith-bench-run-$v
    cp /tmp/pith-bench-run-$v/metrics.jsonl "$OUT/metrics_$v.jsonl" 2>/dev/null
done
{
    echo "== fp8p: $(($(date +%s) - T0)) s in all"
    grep -hE "^(PASS|FAIL)|loss .* vs bf16|internal error|worst" "$OUT/tests.txt"
    for v in bf16 fp8; do
        [ -e "$OUT/metrics_$v.jsonl" ] || { echo "train $v: no metrics"; continue; }
        python3 - "$v" "$OUT/metrics_$v.jsonl" <<'PY'
import json, statistics, sys
R = [json.loads(l) for l in open(sys.argv[2])]
S = [r for r in R if r['step'] >= 3]
fb = statistics.median(r['fwdbwd_s'] for r in S)
peak = max((r.get('gpu_peak_gb') or 0) for r in R)
print(f"train {sys.argv[1]}: steps {len(R)}, fwdbwd_s median (steps >= 3) {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; "
      f"GPU peak {peak:.1f} GB; loss {R[0]['loss']:.4f} -> {R[-1]['loss']:.4f}")
PY
    done
} >>"$S" 2>&1
cat "$S"
