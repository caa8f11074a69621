#!/usr/bin/env bash
# run.sh MODE... — issue 20's device calls (worktree delta), from the repository root with .dev-delta carried:
# stripped binaries (bin/*.gz) and the libraries the device lacks (lib/*.gz, scripts/pack_libs.sh). MODEs:
#   check   the Qwen3.5 GPU tests (+ the model and HF-parity tests), compute-sanitizer memcheck on gpu_op_delta_rule,
#           the delta rule alone (bench_gpu_ops --delta)
#   bench   the Qwen3.5 GPU tests, the delta rule alone (ours, then bench/qwen3_5_8l/peer_delta.py), pith train on
#           bench/qwen3_5_8l (balanced, natural), the HF peers (bench/peer_hf_qwen3_5.py); summary.txt as it goes
set -u
OUT=${OUT:-/tmp/out}; D=.dev-delta; mkdir -p "$OUT" build /tmp/pl
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u
cp -r $D/bench/. bench/  # this branch's benchmark files over the checkout's
for f in $D/bin/*.gz; do b=build/$(basename "$f" .gz); gunzip -c "$f" >"$b"; chmod +x "$b"; done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pithlib-$(basename "$f" .gz); done
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3 4 5; do
    for m in $(ldd build/pith build/test_gpu | awk '/not found/ {print $1}' | sort -u); do
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PITH_TEST_GPU=1 PYTHONUNBUFFERED=1
for mode in "$@"; do case $mode in
check)
    for f in qwen3_5 delta gpu_model_ gpu_hf_parity; do
        timeout 60 build/test_gpu $f >>$OUT/test_gpu.txt 2>&1; echo "rc=$? ($f)" >>$OUT/test_gpu.txt
    done
    PITH_TEST_GRAD_ERRORS=1 timeout 60 build/test_gpu gpu_zz >$OUT/diag.txt 2>&1; echo "rc=$?" >>$OUT/diag.txt
    PITH_TEST_GRAD_ERRORS=1 timeout 30 build/test_gpu gpu_model_qwen3_5 >>$OUT/diag.txt 2>&1
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 90 $CS --tool memcheck build/test_gpu gpu_op_delta_rule >$OUT/memcheck.txt 2>&1; echo "rc=$?" >>$OUT/memcheck.txt
    timeout 60 build/bench_gpu_ops --delta >$OUT/bench_delta.txt 2>&1; echo "rc=$?" >>$OUT/bench_delta.txt
    grep -E "^(PASS|FAIL)|passed|worst|rc=" $OUT/test_gpu.txt | cut -c1-230
    grep -E "ERROR SUMMARY|rc=" $OUT/memcheck.txt; grep -v BENCH $OUT/bench_delta.txt ;;
bench)
    S=$OUT/summary.txt
    timeout 40 build/test_gpu qwen3_5 >$OUT/test_gpu.txt 2>&1; echo "rc=$?" >>$OUT/test_gpu.txt
    grep -E "^(PASS|FAIL)|passed|inline" $OUT/test_gpu.txt | cut -c1-200 | tee -a $S
    timeout 40 build/bench_gpu_ops --delta 2>&1 | grep -v BENCH | tee -a $S
    train() { # train NAME EXTRA...: 8 steps; fwd+bwd and optimizer medians over steps >= 3, the GPU peak, MFU
        rm -rf /tmp/pith-bench-run
        timeout 75 build/pith train bench/qwen3_5_8l/train.json --set max_steps=8 "${@:2}" >$OUT/train_$1.txt 2>&1
        echo "rc=$?" >>$OUT/train_$1.txt; cat /tmp/pith-bench-run/metrics.jsonl >>$OUT/train_$1.txt 2>/dev/null
        python3 - "$1" <<'PY' 2>&1 | tee -a $S
import json, statistics, sys
R = [json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]
X = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in X); st = statistics.median(r['step_time_s'] for r in X)
peak = max((r.get('gpu_peak_gb') or 0) for r in R); tps = 8192 / fb
print(f"pith {sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {tps:,.0f} tokens/s, MFU {tps*6.3e9/989e12*100:.1f}% "
      f"(6.3 GFLOP/token, 989 TFLOP/s); optimizer {(st-fb)*1e3:.1f} ms; GPU peak {peak:.1f} GB; "
      f"loss {R[0]['loss']:.3f} -> {R[-1]['loss']:.3f}")
PY
    }
    mkdir -p /tmp/pith-bench-data
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 248320 --tokens 200000 --seed 1 >/dev/null
    train balanced --set benchmark=true
    train natural
    cd bench
    for c in "--compile --balanced" "--balanced" "--compile"; do
        timeout 110 python3 peer_hf_qwen3_5.py $c >>$OUT/peers.txt 2>&1; echo "rc=$? ($c)" >>$OUT/peers.txt
        grep '^{' $OUT/peers.txt | tail -1 | tee -a $S
    done
    timeout 100 python3 qwen3_5_8l/peer_delta.py >$OUT/peer_delta.txt 2>&1; echo "rc=$?" >>$OUT/peer_delta.txt
    cat $OUT/peer_delta.txt | tee -a $S
    NS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
    if [ -n "$NS" ]; then # the delta rule's kernels one by one
        timeout 60 $NS profile -o /tmp/dr --force-overwrite true build/bench_gpu_ops --delta >/dev/null 2>&1
        timeout 30 $NS stats -r cuda_gpu_kern_sum /tmp/dr.nsys-rep 2>&1 | cut -c1-200 | head -24 >$OUT/kernels.txt
        cat $OUT/kernels.txt
    fi ;;
esac; done
