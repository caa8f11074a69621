#!/usr/bin/env bash
# Call 2 of session s23 (copied to .dev-final/run.sh, run as `bash bench/session.sh h:final:585`): build/ holds the
# candidate (branch cand: the split reduction of few-tile fp32 products, expert offsets on the device), build-cand/
# main 93ed4c3 (the session's start). In order, each under its own limit so the call returns what finished:
# 1. the candidate's whole GPU suite (PITH_BIN = its pith);
# 2. 8 steps of bench/qwen3_30b_a3b_8l (2 × 4096 tokens): balanced new, balanced old, natural new;
# 3. compute-sanitizer memcheck on gpu_op_grouped_wgmma and gpu_op_fp8_grouped (kernels whose launches changed);
# 4. bench_gpu_ops' op table (the new router and RMSNorm rows) of the candidate.
set -u
out=${OUT:-/tmp/h/final}
mkdir -p "$out" /tmp/pith-bench-data
build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
PITH_BIN=build/pith timeout 360 build/test_gpu >"$out/test_gpu.txt" 2>&1
echo "test_gpu rc=$?"
grep -E "^FAIL|^SKIP|passed" "$out/test_gpu.txt"
for run in balanced:build balanced:build-cand natural:build; do
    r=${run%%:*} b=${run#*:} a=()
    [ $r = balanced ] && a=(--set benchmark=true)
    rm -rf /tmp/pith-bench-run
    timeout 100 $b/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=8 "${a[@]}" >"$out/train_${r}_$b.txt" 2>&1
    cp /tmp/pith-bench-run/metrics.jsonl "$out/metrics_${r}_$b.jsonl" 2>/dev/null
    python3 - "${r}_$b" "$out/metrics_${r}_$b.jsonl" <<'PY' 2>&1 | tail -1
import json, statistics, sys
R = [json.loads(l) for l in open(sys.argv[2])]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; "
      f"GPU peak {max(r['gpu_peak_gb'] for r in R):.1f} GB; loss {R[0]['loss']:.4f} -> {R[-1]['loss']:.4f}")
PY
done
for t in gpu_op_grouped_wgmma gpu_op_fp8_grouped; do
    PITH_TEST_SANITIZE=1 timeout 45 $CS --tool memcheck build/test_gpu $t >"$out/memcheck_$t.txt" 2>&1
    echo "memcheck $t: rc=$? $(grep -h 'ERROR SUMMARY' "$out/memcheck_$t.txt")"
done
timeout 45 build/bench_gpu_ops >"$out/bench_ops.txt" 2>&1
grep -E "router|rmsnorm|q_proj" "$out/bench_ops.txt"
gzip -9 "$out"/*.txt
