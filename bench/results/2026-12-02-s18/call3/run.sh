#!/usr/bin/env bash
# The AdamW flag on the GPU: its op test, the nonfinite reproduction on device=cuda, and the 8-layer Qwen3 benchmark.
set -u
OUT=${OUT:-/tmp/h/fin}; mkdir -p $OUT; S=$OUT/summary.txt; : >$S
timeout 120 build/test_gpu gpu_op_vector_paths gpu_op_elementwise gpu_train_tracks_cpu gpu_det_qwen3 >$OUT/tests.txt 2>&1; echo "tests rc=$?" >>$S
grep -E "^(PASS|FAIL|SKIP)|passed" $OUT/tests.txt >>$S
mkdir -p /tmp/nf && build/pith synth --output /tmp/nf/d.bin --vocab 256 --tokens 200000 >/dev/null
timeout 60 build/pith train examples/tiny/train.json --set device=cuda --set dataset=/tmp/nf/d.bin --set max_steps=1 --set optimizer.lr=1e300 --set 'scheduler={"type":"constant"}' --set save_location=/tmp/nf/ck --set run_dir=/tmp/nf/run >$OUT/nf.txt 2>&1
echo "nonfinite on cuda: rc=$? $(tail -1 $OUT/nf.txt); checkpoints: $(ls /tmp/nf/ck 2>/dev/null | grep -c step)" >>$S
rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
timeout 150 build/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=8 --set benchmark=true >$OUT/bench.txt 2>&1; echo "bench rc=$?" >>$S
python3 - >>$S <<'PY'
import json, statistics
R=[json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]; S=R[2:]
fb=statistics.median(r['fwdbwd_s'] for r in S); st=statistics.median(r['step_time_s'] for r in S)
print(f"qwen3_30b_a3b_8l balanced: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; step {st*1e3:.1f} ms")
PY
cat $S
