#!/usr/bin/env bash
# run.sh MODE — on the device, from the repository root, with .dev-perf carried (pack.sh made it): unpack the
# binaries and libraries, then MODE: kernels (wgmma tests + grouped microbenchmarks + the PyTorch peer),
# e2e (the 8-layer benchmarks, natural and balanced, new and old expert paths), final (sanitizer, GPU suite,
# the recorded run). Logs under $OUT; a short table last.
set -u
OUT=${OUT:-/tmp/out}; D=.dev-perf; mkdir -p "$OUT" build /tmp/pl
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
mkdir -p /tmp/pith-bench-data
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PITH_TEST_GPU=1 PYTHONUNBUFFERED=1
train() { # train NAME CONFIG EXTRA...: 8 steps, fwd+bwd and optimizer medians over steps >= 3
    local n=$1 cfg=$2; shift 2
    rm -rf /tmp/pith-bench-run
    timeout 60 build/pith train $cfg --set max_steps=8 "$@" >$OUT/train_$n.txt 2>&1; echo "rc=$?" >>$OUT/train_$n.txt
    cat /tmp/pith-bench-run/metrics.jsonl >>$OUT/train_$n.txt 2>/dev/null
    python3 -c "import json,statistics; R=[json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')][2:]; fb=statistics.median(r['fwdbwd_s'] for r in R); st=statistics.median(r['step_time_s'] for r in R); print(f'$n: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; peak {R[-1].get(\"gpu_peak_gb\",0):.1f} GB')" 2>&1 | tee -a $OUT/summary.txt
}
case "${1:-kernels}" in
kernels)
    timeout 120 build/test_gpu gpu_op_grouped 2>&1 | tee $OUT/test_grouped.txt | grep -E "^(PASS|FAIL)|vs cpu|differ|did not|passed|rror" | head -60
    if grep -q FAIL $OUT/test_grouped.txt; then
        PITH_WGMMA_MN_SWAP=1 timeout 60 build/test_gpu gpu_op_grouped_wgmma >$OUT/test_swap.txt 2>&1
        echo "== with PITH_WGMMA_MN_SWAP=1"; grep -E "^(PASS|FAIL)|vs cpu" $OUT/test_swap.txt | head -30
    fi
    timeout 150 build/bench_gpu_ops --grouped >$OUT/bench_grouped.txt 2>&1; echo "rc=$?" >>$OUT/bench_grouped.txt
    timeout 120 python3 $D/peer_grouped.py >$OUT/peer_grouped.txt 2>&1
    grep -v "^BENCH\|^PEER" $OUT/bench_grouped.txt | tail -80; grep -v "^PEER" $OUT/peer_grouped.txt
    ;;
e2e)
    timeout 150 build/test_gpu gpu_op_grouped gpu_model 2>&1 | tee $OUT/test_grouped.txt | grep -E "^(PASS|FAIL)|vs cpu|differ|did not|passed|rror" | head -60
    timeout 100 build/bench_gpu_ops --grouped >$OUT/bench_grouped.txt 2>&1; echo "rc=$?" >>$OUT/bench_grouped.txt
    grep -v "^BENCH" $OUT/bench_grouped.txt | grep "wgmma\|floor"
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
    for k in wgmma auto; do
        PITH_GROUPED_KERNEL=$k train qwen3_natural_$k $D/qwen3_30b_a3b_8l/train.json
        PITH_GROUPED_KERNEL=$k train qwen3_balanced_$k $D/qwen3_30b_a3b_8l/train.json --set benchmark=true
    done
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 102400 --tokens 200000 --seed 1 >/dev/null
    for k in wgmma auto; do
        PITH_GROUPED_KERNEL=$k train dsv2_balanced_$k $D/deepseek_v2_lite_8l/train.json --set benchmark=true
    done
    cat $OUT/summary.txt
    ;;
final)
    for f in gpu_op_ gpu_model gpu_hf_parity_train; do timeout 40 build/test_gpu $f >>$OUT/test_gpu.txt 2>&1; done
    grep -E "^(FAIL)|passed" $OUT/test_gpu.txt
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    timeout 35 $san --tool memcheck build/test_gpu gpu_op_grouped_wgmma >$OUT/sanitizer.txt 2>&1; echo "memcheck rc=$?" >>$OUT/sanitizer.txt
    timeout 30 $san --tool racecheck build/test_gpu gpu_op_grouped_wgmma >>$OUT/sanitizer.txt 2>&1; echo "racecheck rc=$?" >>$OUT/sanitizer.txt
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|^(PASS|FAIL)" $OUT/sanitizer.txt
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
    train qwen3_natural $D/qwen3_30b_a3b_8l/train.json
    train qwen3_balanced $D/qwen3_30b_a3b_8l/train.json --set benchmark=true
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 102400 --tokens 200000 --seed 1 >/dev/null
    train dsv2_balanced $D/deepseek_v2_lite_8l/train.json --set benchmark=true
    cd $OUT && tar czf train_logs.tgz train_*.txt && rm train_*.txt && cd - >/dev/null
    cat $OUT/summary.txt
    ;;
esac
