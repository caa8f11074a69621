#!/usr/bin/env bash
# .det/run.sh — one device call for branch det (deterministic: true): unpack the carried binaries and libraries
# (as bench/session.sh does), the GPU tests of the changed kernels and the new gpu_det_*, then the 8-layer Qwen3
# benchmark twice each way (default, deterministic), interleaved. Logs under $OUT.
set -u
D=.det; B=build-det; L=/tmp/pl; mkdir -p $B $L /tmp/logs
for f in $D/bin/*.gz; do gunzip -c "$f" >$B/$(basename "$f" .gz); chmod +x $B/$(basename "$f" .gz); done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pithlib-$(basename "$f" .gz); done
export LD_LIBRARY_PATH=$L${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3; do for m in $(ldd $B/test_gpu | awk '/not found/ {print $1}' | sort -u); do
    [ -e /tmp/pithlib-$m ] && cp /tmp/pithlib-$m $L/$m; done; done
if ldd $B/test_gpu | grep -q "libmpi.so.40 => not found"; then
    export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib:$LD_LIBRARY_PATH
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
ldd $B/test_gpu | grep "not found"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PITH_TEST_GPU=1 PITH_BIN=$PWD/$B/pith
S=$OUT/summary.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } | tee $S
t0=$(date +%s)
for f in ${FILTERS:-gpu_det_ gpu_op_rmsnorm gpu_op_linear gpu_op_grouped_linear_bias gpu_op_embedding \
    gpu_op_cross_entropy gpu_op_elementwise gpu_op_moe_lb_loss gpu_op_moe_sort_gather_scatter gpu_op_vector_paths \
    gpu_op_attention gpu_op_qwen3_5_elementwise gpu_model_bf16 gpu_model_deepseek_v2 gpu_model_gpt_oss \
    gpu_hf_parity_train_fp32}; do
    timeout 200 $B/test_gpu $f >/tmp/logs/test_$f.txt 2>&1; echo "rc=$?" >>/tmp/logs/test_$f.txt
    grep -E "^FAIL|^PASS|passed|rc=|     " /tmp/logs/test_$f.txt | grep -v "^     path\|^       " | sed "s/^/$f: /" >>$S
done
echo "tests: $(( $(date +%s) - t0 )) s" | tee -a $S
# the benchmark: bench/session.sh's train (synthetic tokens, 8 steps, median of fwd+bwd over steps >= 3)
rm -rf /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
$B/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
for run in default_1 det_1 default_2 det_2; do
    a=(); [ ${run%_*} = det ] && a=(--set deterministic=true)
    rm -rf /tmp/pith-bench-run
    t1=$(date +%s)
    timeout 150 $B/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=8 "${a[@]}" >/tmp/logs/train_$run.txt 2>&1
    echo "rc=$? in $(( $(date +%s) - t1 )) s" >>/tmp/logs/train_$run.txt
    cp /tmp/pith-bench-run/metrics.jsonl /tmp/logs/metrics_$run.jsonl 2>/dev/null
    python3 - "$run" /tmp/logs/metrics_$run.jsonl <<'PY' 2>&1 | tail -1 | tee -a $S
import json, statistics, sys
R = [json.loads(l) for l in open(sys.argv[2])]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
peak = max((r.get('gpu_peak_gb') or 0) for r in R)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; step {st*1e3:.1f} ms = {8192/st:,.0f} "
      f"tokens/s; GPU peak {peak:.1f} GB; loss {R[0]['loss']:.6f} -> {R[-1]['loss']:.6f}")
PY
    grep -E "^deterministic:|note: attention|rc=" /tmp/logs/train_$run.txt | sed "s/^/  $run: /" >>$S
done
for p in default det; do
    for r in 1 2; do grep -o '"\(loss\|grad_norm\)": [^,}]*' /tmp/logs/metrics_${p}_$r.jsonl >/tmp/logs/lg_${p}_$r.txt; done
    if cmp -s /tmp/logs/lg_${p}_1.txt /tmp/logs/lg_${p}_2.txt && [ -s /tmp/logs/lg_${p}_1.txt ]; then
        echo "$p: two runs' loss and grad_norm byte-identical ($(wc -l </tmp/logs/lg_${p}_1.txt) values)" | tee -a $S
    else
        echo "$p: two runs' loss and grad_norm DIFFER" | tee -a $S; paste /tmp/logs/lg_${p}_1.txt /tmp/logs/lg_${p}_2.txt >>$S
    fi
done
echo "total: $(( $(date +%s) - t0 )) s" | tee -a $S
tar czf $OUT/logs.tgz -C /tmp logs
echo "== summary"; cat $S
