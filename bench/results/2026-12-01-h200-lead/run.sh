#!/usr/bin/env bash
# run.sh MODE... — the lead's end-of-session device call, from the repository root with .gpu carried (binaries and
# the libraries the device lacks: scripts/pack_libs.sh; tree.tgz when the call runs an unlanded tree). Logs go to
# /tmp/logs and come back as $OUT/logs.tgz (the device returns at most 8 files) beside $OUT/summary.txt.
# MODEs, run in the order given:
#   test           the whole GPU suite (build/test_gpu)
#   bench          pith train on each 8-step benchmark in RUNS (NAME:natural|balanced; 2 × 4096 tokens)
#   peers-gpt-oss  HF transformers eager and + torch.compile on gpt-oss-20b's 4-layer cut (bench/peer_hf_gpt_oss.py)
#   peers-qwen3.5  the same for Qwen3.5-MoE's 8-layer cut (bench/peer_hf_qwen3_5.py), when it exists
#   recompute      bench/run_recompute.sh: recompute none/selective/full and optimizer.offload on the Qwen3 cut
#   schedule       bench/run_gpu.sh --schedule: pp = 1 through the DualPipeV engine beside the plain step
# summary.txt (one line per run) last.
set -u
RET=${OUT:-/tmp/out}; OUT=/tmp/logs; D=.gpu; mkdir -p "$RET" "$OUT" build /tmp/pl
[ -e $D/tree.tgz ] && tar xzf $D/tree.tgz # an unlanded tree's sources and scripts over the checkout
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
    [ -e $dir/train.json ] || { echo "$n: no $dir" | tee -a $OUT/summary.txt; return; }
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
peers() { # peers NAME SCRIPT: eager and compiled, balanced and natural
    [ -e $2 ] || { echo "$1 peers: no $2" | tee -a $OUT/summary.txt; return; }
    for c in "" --compile; do for b in --balanced ""; do
        timeout 240 python3 $2 $c $b >>$OUT/peers_$1.txt 2>&1; echo "rc=$? ($c $b)" >>$OUT/peers_$1.txt
    done; done
    grep '^{' $OUT/peers_$1.txt | tee -a $OUT/summary.txt
}
for mode in "$@"; do case $mode in
test)
    timeout ${TEST_T:-300} build/test_gpu ${FILTER:-} >$OUT/test_gpu.txt 2>&1; echo "rc=$?" >>$OUT/test_gpu.txt
    grep -E "^FAIL|passed" $OUT/test_gpu.txt | tee -a $OUT/summary.txt ;;
bench) # RUNS: NAME:ROUTING pairs, default every benchmark with both routings
    declare -A dir=([qwen3]=bench/qwen3_30b_a3b_8l [gpt_oss]=bench/gpt_oss_20b_4l [qwen3_5]=bench/qwen3_5_8l
        [dsv2]=bench/deepseek_v2_lite_8l)
    declare -A vocab=([qwen3]=151936 [gpt_oss]=201088 [qwen3_5]=248320 [dsv2]=102400)
    for nr in ${RUNS:-qwen3:natural qwen3:balanced gpt_oss:natural gpt_oss:balanced qwen3_5:natural qwen3_5:balanced}; do
        n=${nr%%:*} r=${nr#*:} x=(); [ $r = balanced ] && x=(--set benchmark=true)
        train ${n}_$r ${dir[$n]} ${vocab[$n]} "${x[@]}" ${QX:-} # QX: extra --set options
    done ;;
peers-gpt-oss) peers gpt_oss bench/peer_hf_gpt_oss.py ;;
peers-qwen3.5) peers qwen3_5 bench/peer_hf_qwen3_5.py ;;
recompute)
    PITH=build/pith OUT=$OUT/recompute timeout ${RECOMPUTE_T:-240} bash bench/run_recompute.sh --steps=6 >$OUT/recompute.txt 2>&1
    grep '^|' $OUT/recompute.txt | tee -a $OUT/summary.txt ;;
schedule)
    OUT=$OUT/schedule timeout ${SCHEDULE_T:-200} bash bench/run_gpu.sh --schedule --steps=6 >$OUT/schedule.txt 2>&1
    grep -iE "schedule|plain" $OUT/schedule.txt | tail -4 | tee -a $OUT/summary.txt ;;
esac; done
echo "== summary"; cat $OUT/summary.txt
cp $OUT/summary.txt $RET/; tar czf $RET/logs.tgz -C /tmp logs
