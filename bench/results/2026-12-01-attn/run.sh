#!/usr/bin/env bash
# run.sh MODE... — the attn helper's device calls, from the repository root with .dev-attn carried (stripped
# binaries and the libraries the device lacks: bin/*.gz, lib/*.gz, packed as ../2026-12-01-h200-final/run.sh reads
# them). MODEs, in the order given:
#   test   build/test_gpu for each substring in FILTERS (default: the GPU ops, models and HF parity)
#   san    compute-sanitizer memcheck and racecheck on gpu_op_grouped_wgmma (PITH_TEST_SANITIZE=1: small shapes)
#   bench  pith train, 8 steps, on each NAME:natural|balanced of RUNS (2 × 4096 tokens)
#   peers  HF transformers 5.17 on gpt-oss-20b's 4-layer cut for each of PEERS (eager|compile):(balanced|natural)
# Logs under $OUT; summary.txt last.
set -u
OUT=${OUT:-/tmp/out}; D=.dev-attn; mkdir -p "$OUT" build /tmp/pl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader; date -u
for f in $D/bin/*.gz; do b=build/$(basename "$f" .gz); gunzip -c "$f" >"$b"; chmod +x "$b"; done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pithlib-$(basename "$f" .gz); done
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3 4 5; do # only the libraries the device lacks
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
train() { # train NAME DIR VOCAB EXTRA...: 8 steps; fwd+bwd and optimizer medians over steps >= 3, the GPU peak
    local n=$1 dir=$2 vocab=$3; shift 3
    rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab $vocab --tokens 200000 --seed 1 >/dev/null
    timeout 120 build/pith train $dir/train.json --set max_steps=8 "$@" >$OUT/train_$n.txt 2>&1
    echo "rc=$?" >>$OUT/train_$n.txt; cat /tmp/pith-bench-run/metrics.jsonl >>$OUT/train_$n.txt 2>/dev/null
    python3 - "$n" <<'PY' 2>&1 | tee -a $OUT/summary.txt
import json, statistics, sys
R = [json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
peak = max((r.get('gpu_peak_gb') or 0) for r in R)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; "
      f"GPU peak {peak:.1f} GB; loss {R[0]['loss']:.3f} -> {R[-1]['loss']:.3f}")
PY
}
for mode in "$@"; do case $mode in
test)
    for f in ${FILTERS:-gpu_op_ gpu_model gpu_hf_parity}; do
        timeout 200 build/test_gpu $f >$OUT/test_gpu_$f.txt 2>&1; echo "rc=$?" >>$OUT/test_gpu_$f.txt
        cat $OUT/test_gpu_$f.txt >>$OUT/test_gpu.txt
        grep -E "^FAIL|passed" $OUT/test_gpu_$f.txt | sed "s/^/$f: /" | tee -a $OUT/summary.txt
    done
    grep -E "ran |window|E=|vs cpu" $OUT/test_gpu.txt | head -80 ;;
san)
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    export PITH_TEST_SANITIZE=1
    timeout 90 $san --tool memcheck build/test_gpu gpu_op_grouped_wgmma >$OUT/sanitizer.txt 2>&1; echo "memcheck rc=$?" >>$OUT/sanitizer.txt
    timeout 90 $san --tool racecheck build/test_gpu gpu_op_grouped_wgmma >>$OUT/sanitizer.txt 2>&1; echo "racecheck rc=$?" >>$OUT/sanitizer.txt
    unset PITH_TEST_SANITIZE
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=|^(PASS|FAIL)" $OUT/sanitizer.txt | tee -a $OUT/summary.txt ;;
bench)
    declare -A dir=([qwen3]=bench/qwen3_30b_a3b_8l [gpt_oss]=bench/gpt_oss_20b_4l)
    declare -A vocab=([qwen3]=151936 [gpt_oss]=201088)
    for nr in ${RUNS:-gpt_oss:balanced gpt_oss:natural qwen3:balanced}; do
        n=${nr%%:*} r=${nr#*:} x=(); [ $r = balanced ] && x=(--set benchmark=true)
        train ${n}_$r ${dir[$n]} ${vocab[$n]} "${x[@]}"
    done ;;
peers)
    for p in ${PEERS:-compile:balanced compile:natural}; do
        c=; b=; [ ${p%%:*} = compile ] && c=--compile; [ ${p#*:} = balanced ] && b=--balanced
        timeout 200 python3 bench/peer_hf_gpt_oss.py $c $b >>$OUT/peers_gpt_oss.txt 2>&1
        echo "rc=$? ($c $b)" >>$OUT/peers_gpt_oss.txt
    done
    grep '^{' $OUT/peers_gpt_oss.txt | tee -a $OUT/summary.txt ;;
esac; done
echo "== summary"; cat $OUT/summary.txt
