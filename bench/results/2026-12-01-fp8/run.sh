#!/usr/bin/env bash
# run.sh — issue 22's one device call, from the repository root with .dev-fp8 carried (bin/*.gz: pith, test_gpu,
# bench_gpu_ops built on the development machine; lib/*.gz: the Debian libraries the device lacks, packed by
# scripts/pack_libs.sh). The FP8 GPU tests, the FP8 expert GEMMs beside bf16 (bench_gpu_ops --fp8), and the 8-layer
# Qwen3-30B-A3B benchmark (force-balanced routing, 2 × 4096 tokens) in bf16 and in FP8. Logs under $OUT, a table last.
set -u
OUT=${OUT:-/tmp/out}; D=.dev-fp8; mkdir -p "$OUT" build /tmp/pl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader; date -u
for f in $D/bin/*.gz; do b=build/$(basename "$f" .gz); gunzip -c "$f" >"$b"; chmod +x "$b"; done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pithlib-$(basename "$f" .gz); done
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3 4 5; do # only the libraries the device lacks
    for m in $(ldd build/pith build/test_gpu build/bench_gpu_ops | awk '/not found/ {print $1}' | sort -u); do
        [ -e /tmp/pithlib-$m ] && cp /tmp/pithlib-$m /tmp/pl/$m
    done
done
if ldd build/pith | grep -q "libmpi.so.40 => not found"; then
    export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib:$LD_LIBRARY_PATH
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
ldd build/test_gpu | grep "not found"
export PITH_TEST_GPU=1
for f in fp8; do
    timeout 60 build/test_gpu $f >$OUT/test_gpu_$f.txt 2>&1; echo "rc=$?" >>$OUT/test_gpu_$f.txt
    grep -E "^(PASS|FAIL)|passed|     " $OUT/test_gpu_$f.txt | tee -a $OUT/summary.txt
done
timeout 30 build/bench_gpu_ops --fp8 >$OUT/bench_fp8_gemms.txt 2>&1; echo "rc=$?" >>$OUT/bench_fp8_gemms.txt
grep -v '^BENCH' $OUT/bench_fp8_gemms.txt | tee -a $OUT/summary.txt
train() { # train NAME EXTRA...: 5 steps; fwd+bwd and optimizer medians over steps >= 3, the GPU peak
    local n=$1; shift
    rm -rf /tmp/pith-bench-run
    timeout 55 build/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=5 --set benchmark=true "$@" \
        >$OUT/train_$n.txt 2>&1
    echo "rc=$?" >>$OUT/train_$n.txt; cat /tmp/pith-bench-run/metrics.jsonl >>$OUT/train_$n.txt 2>/dev/null
    python3 - "$n" <<'PY' 2>&1 | tee -a $OUT/summary.txt
import json, statistics, sys
R = [json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
peak = max((r.get('gpu_peak_gb') or 0) for r in R)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; "
      f"GPU peak {peak:.1f} GB; loss {R[0]['loss']:.4f} -> {R[-1]['loss']:.4f}")
PY
    grep "^plan" $OUT/train_$n.txt | head -1 | tee -a $OUT/summary.txt
}
mkdir -p /tmp/pith-bench-data
build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
train qwen3_bf16
train qwen3_fp8 --set fp8=true
echo "== summary"; cat $OUT/summary.txt
