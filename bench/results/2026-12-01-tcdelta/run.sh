#!/usr/bin/env bash
# run.sh MODE... — issue 20's tensor-core delta rule on the device (worktree tcdelta), from the repository root with
# .dev-tcdelta carried: stripped binaries (bin/*.gz), the libraries the device lacks (lib/*.gz, scripts/pack_libs.sh)
# and this branch's bench/qwen3_5_8l (bench/). Logs straight under $OUT (at most 8 files come back, also from a run
# cut short), summary.txt last.
# MODEs, in the order given:
#   test      gpu_op_delta_rule, gpu_op_qwen3_5_elementwise (fp32 and bf16 against the CPU's fp64 reference) and the
#             Qwen3.5 model case gpu_model_qwen3_5_moe
#   memcheck, racecheck  compute-sanitizer's tools on gpu_op_delta_rule
#   bench     bench_gpu_ops --delta, then each delta kernel's time (ncu, gpu__time_duration of the first forward and
#             backward)
#   peer      bench/qwen3_5_8l/peer_delta.py (the PyTorch peer)
#   step      pith train on bench/qwen3_5_8l (balanced, 8 steps)
set -u
L=${OUT:-/tmp/out}; D=.dev-tcdelta; mkdir -p "$L" build /tmp/pl; S=$L/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a $S; date -u | tee -a $S
[ -d $D/bench ] && cp -r $D/bench/. bench/
for f in $D/bin/*.gz; do b=build/$(basename "$f" .gz); gunzip -c "$f" >"$b"; chmod +x "$b"; done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pithlib-$(basename "$f" .gz); done
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3 4 5; do
    for m in $(ldd build/test_gpu build/bench_gpu_ops build/pith 2>/dev/null | awk '/not found/ {print $1}' | sort -u); do
        [ -e /tmp/pithlib-$m ] && cp /tmp/pithlib-$m /tmp/pl/$m
    done
done
if ldd build/pith | grep -q "libmpi.so.40 => not found"; then
    export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib:$LD_LIBRARY_PATH
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
ldd build/test_gpu build/bench_gpu_ops | grep "not found"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PITH_TEST_GPU=1 PYTHONUNBUFFERED=1
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for mode in "$@"; do case $mode in
test)
    timeout 60 build/test_gpu gpu_op_delta_rule >$L/test_gpu.txt 2>&1; echo "rc=$?" >>$L/test_gpu.txt
    timeout 20 build/test_gpu gpu_op_qwen3_5 >>$L/test_gpu.txt 2>&1; echo "rc=$?" >>$L/test_gpu.txt
    timeout 30 build/test_gpu gpu_model_qwen3_5 >>$L/test_gpu.txt 2>&1; echo "rc=$?" >>$L/test_gpu.txt
    grep -E "^(PASS|FAIL)|passed|worst|rc=|error" $L/test_gpu.txt | cut -c1-200 | tee -a $S ;;
memcheck)
    timeout 80 $CS --tool memcheck build/test_gpu gpu_op_delta_rule >$L/memcheck.txt 2>&1; echo "rc=$?" >>$L/memcheck.txt
    grep -E "ERROR SUMMARY|rc=" $L/memcheck.txt | tee -a $S; grep -m5 -A6 "Invalid" $L/memcheck.txt | tee -a $S ;;
racecheck)
    timeout 45 $CS --tool racecheck build/test_gpu gpu_op_delta_rule >$L/racecheck.txt 2>&1
    echo "rc=$?" >>$L/racecheck.txt; grep -E "RACECHECK SUMMARY|rc=" $L/racecheck.txt | tee -a $S ;;
bench)
    timeout 40 build/bench_gpu_ops --delta >$L/bench_delta.txt 2>&1; echo "rc=$?" >>$L/bench_delta.txt
    grep -v BENCH $L/bench_delta.txt | tee -a $S
    # the delta rule's kernels of the last timed forward (3 kernels; 3 forwards skipped) and the warm-up backward (7)
    timeout 60 $NCU --clock-control none --metrics gpu__time_duration.sum -k regex:"delta_|tc_" --launch-skip 9 \
        --launch-count 10 \
        build/bench_gpu_ops --delta >$L/ncu_delta.txt 2>&1
    echo "rc=$?" >>$L/ncu_delta.txt
    awk 'match($0, /^  (void )?[a-z_]+_kernel/) {k=substr($0, RSTART, RLENGTH); sub(/^ +(void )?/, "", k)}
         /gpu__time_duration.sum/ {print k, $(NF), $(NF-1)}' $L/ncu_delta.txt | tee -a $S ;;
peer)
    (cd bench && timeout 100 python3 qwen3_5_8l/peer_delta.py >$L/peer_delta.txt 2>&1; echo "rc=$?" >>$L/peer_delta.txt)
    cat $L/peer_delta.txt | tee -a $S ;;
step)
    mkdir -p /tmp/pith-bench-data; rm -rf /tmp/pith-bench-run
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 248320 --tokens 200000 --seed 1 >/dev/null
    timeout 60 build/pith train bench/qwen3_5_8l/train.json --set max_steps=8 --set benchmark=true >$L/train.txt 2>&1
    echo "rc=$?" >>$L/train.txt; cat /tmp/pith-bench-run/metrics.jsonl >>$L/train.txt 2>/dev/null
    python3 - <<'PY' 2>&1 | tee -a $S
import json, statistics
R = [json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]
X = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in X)
print(f"pith qwen3_5_8l balanced: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; "
      f"GPU peak {max((r.get('gpu_peak_gb') or 0) for r in R):.1f} GB; loss {R[0]['loss']:.3f} -> {R[-1]['loss']:.3f}")
PY
    ;;
esac; done
echo "==== summary"; cat $S
