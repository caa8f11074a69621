#!/usr/bin/env bash
# Call 3 of session s23 (copied to .dev-ab/run.sh, run as `bash bench/session.sh h:ab:400`): where the candidate's
# time goes. Three builds of pith: old = main 93ed4c3 (build-cand/), split = b6debed (only lt_matmul's split reduction;
# .gpu/split), new = e2bface (the split, expert offsets on the device, warp_argmax; build/). 20 steps of
# bench/qwen3_30b_a3b_8l (2 × 4096 tokens) each, force-balanced, in the order old split new × 3 (the medians of steps
# 3–20 of each run, then the median of the three runs per build), then natural routing old and new once; then
# bench_gpu_ops' op table of new (the router and RMSNorm rows); last, new's GPU tests of the fp32-operand bf16
# expert gradient (its sums now in the conversion pool, a chunk of dw_e at a time).
set -u
out=${OUT:-/tmp/h/ab}
mkdir -p "$out" /tmp/pith-bench-data build-split
gunzip -c .gpu/split/pith.gz >build-split/pith && chmod +x build-split/pith
build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
one() { # one NAME BIN ARGS...
    local n=$1 b=$2
    shift 2
    rm -rf /tmp/pith-bench-run
    timeout 60 $b/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=20 "$@" >"$out/train_$n.txt" 2>&1
    cp /tmp/pith-bench-run/metrics.jsonl "$out/metrics_$n.jsonl" 2>/dev/null
    python3 - "$n" "$out/metrics_$n.jsonl" <<'PY' 2>&1 | tail -1
import json, statistics, sys
R = [json.loads(l) for l in open(sys.argv[2])]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.2f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; "
      f"GPU peak {max(r['gpu_peak_gb'] for r in R):.1f} GB; loss {R[-1]['loss']:.4f}")
PY
}
for i in 1 2 3; do
    one old-$i build-cand --set benchmark=true
    one split-$i build-split --set benchmark=true
    one new-$i build --set benchmark=true
done
one old-natural build-cand
one new-natural build
python3 - "$out" <<'PY'
import json, statistics, sys
o = sys.argv[1]
def fb(n):
    try: R = [json.loads(l) for l in open(f"{o}/metrics_{n}.jsonl")]
    except OSError: return None
    return statistics.median(r['fwdbwd_s'] for r in R[2:]) * 1e3
m = {b: [x for x in (fb(f"{b}-{i}") for i in (1, 2, 3)) if x] for b in ("old", "split", "new")}
for b, v in m.items():
    if v: print(f"{b}: runs {' '.join(f'{x:.2f}' for x in v)} ms, median {statistics.median(v):.2f} ms = {8192e3/statistics.median(v):,.0f} tokens/s")
if m["old"] and m["new"] and m["split"]:
    o_, s_, n_ = (statistics.median(m[b]) for b in ("old", "split", "new"))
    print(f"new / old tokens/s {o_/n_:.4f}; split / old {o_/s_:.4f}; new / split {s_/n_:.4f}")
PY
timeout 40 build/bench_gpu_ops >"$out/bench_ops.txt" 2>&1
grep -E "router|rmsnorm|q_proj" "$out/bench_ops.txt" | grep -v BENCH
PITH_BIN=build/pith timeout 60 build/test_gpu gpu_op_grouped_linear gpu_model_grad_bf16 gpu_op_linear >"$out/test_gpu.txt" 2>&1
echo "test_gpu rc=$?"
grep -E "^FAIL|^PASS|passed" "$out/test_gpu.txt"
