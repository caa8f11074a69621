#!/usr/bin/env bash
# run.sh MODE — issue 20's device calls (worktree q35), from the repository root with .dev-q35 carried: stripped
# binaries (bin/*.gz: pith, test_gpu, test_gpu_planted_*, kernel_events.so) and the Debian libraries the device lacks
# (lib/*.gz, scripts/pack_libs.sh). Logs go to /tmp/logs, back as $OUT/logs.tgz beside $OUT/summary.txt.
#   profile  test_gpu qwen3_5 with PITH_TEST_GRAD_ERRORS=1 (every tensor's error) and attention_forms; then one
#            `pith train` of bench/qwen3_5_8l (balanced routing, 4 steps) under kernel_events.so: GPU ms per step of
#            every kernel, cuBLASLt shape, grouped GEMM and cuDNN graph (sum over the run / 4), largest first
#   final    test_gpu qwen3_5 + attention, the planted-bug builds' gpu_model_qwen3_5_moe (must FAIL), pith train
#            balanced and natural (8 steps), HF eager (balanced) and HF + torch.compile (balanced, limited by what
#            is left of CALL_S seconds)
set -u
RET=${OUT:-/tmp/out}; OUT=/tmp/logs; D=.dev-q35; t0=$(date +%s); rm -rf "$OUT"; mkdir -p "$RET" "$OUT" build /tmp/pl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee $OUT/summary.txt
for f in $D/bin/*.gz; do b=build/$(basename "$f" .gz); gunzip -c "$f" >"$b"; chmod +x "$b"; done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pithlib-$(basename "$f" .gz); done
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3; do # only the libraries the device lacks
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PITH_TEST_GPU=1 PYTHONUNBUFFERED=1
data() { rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 248320 --tokens 200000 --seed 1 >/dev/null; }
tests() { # tests NAME BINARY FILTER...
    local n=$1 b=$2; shift 2
    timeout ${TEST_T:-60} $b "$@" >$OUT/$n.txt 2>&1; echo "rc=$?" >>$OUT/$n.txt
    grep -E "^(PASS|FAIL)|passed|BF16: loss|head dim 256" $OUT/$n.txt | cut -c1-230 | sed "s/^/$n: /" | tee -a $OUT/summary.txt
}
train() { # train NAME STEPS EXTRA...: fwd+bwd and optimizer medians over steps >= 3, the GPU peak
    local n=$1 steps=$2; shift 2
    data; timeout 45 build/pith train bench/qwen3_5_8l/train.json --set max_steps=$steps --set tensorboard=false "$@" \
        >$OUT/train_$n.txt 2>&1
    echo "rc=$?" >>$OUT/train_$n.txt; cat /tmp/pith-bench-run/metrics.jsonl >>$OUT/train_$n.txt 2>/dev/null
    grep -iE "cudnn|refused|error" $OUT/train_$n.txt | head -5 | cut -c1-200
    python3 - "$n" <<'PY' 2>&1 | tee -a $OUT/summary.txt
import json, statistics, sys
R = [json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
peak = max((r.get('gpu_peak_gb') or 0) for r in R)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; "
      f"GPU peak {peak:.1f} GB; loss {R[0]['loss']:.3f} -> {R[-1]['loss']:.3f}")
PY
}
case ${1:-} in
profile)
    PITH_TEST_GRAD_ERRORS=1 tests test_qwen3_5 build/test_gpu qwen3_5
    tests test_attention build/test_gpu attention_forms
    data
    PITH_KERNEL_EVENTS=$OUT/events.tsv LD_PRELOAD=$PWD/build/kernel_events.so timeout 45 build/pith train \
        bench/qwen3_5_8l/train.json --set max_steps=4 --set tensorboard=false --set benchmark=true \
        >$OUT/train_profile.txt 2>&1
    echo "rc=$?" >>$OUT/train_profile.txt; cat /tmp/pith-bench-run/metrics.jsonl >>$OUT/train_profile.txt 2>/dev/null
    grep -E "^step|cudnn|error" $OUT/train_profile.txt | cut -c1-160
    python3 - $OUT <<'PY' | tee $OUT/step_kernels.md
import sys
rows = []
for line in open(sys.argv[1] + "/events.tsv"):
    calls, ms, name = line.rstrip("\n").split("\t", 2)
    rows.append((float(ms) / 4, int(calls) / 4, name))
rows.sort(reverse=True)
total = sum(r[0] for r in rows)
print(f"| call | ms/step | calls/step | share |\n|---|---:|---:|---:|")
for ms, calls, name in rows[:45]:
    print(f"| {name[:110]} | {ms:.2f} | {calls:g} | {ms / total:.1%} |")
print(f"\nsum {total:.1f} ms per step (the 4-step run's GPU time / 4, initialisation included); {len(rows)} calls")
PY
    ;;
final)
    tests test_qwen3_5 build/test_gpu qwen3_5
    tests test_attention build/test_gpu attention
    for p in build/test_gpu_planted_*; do # each a build with one bf16-only bug (README.md: the planted bugs)
        [ -e $p ] && tests ${p#build/test_gpu_} $p gpu_model_qwen3_5_moe
    done
    train balanced 8 --set benchmark=true
    train natural 6
    for c in "" --compile; do
        left=$((${CALL_S:-150} - ($(date +%s) - t0))); [ -z "$c" ] && left=$((left > 60 ? 60 : left))
        [ $left -lt 20 ] && { echo "hf $c: no time left" | tee -a $OUT/summary.txt; continue; }
        timeout $left python3 bench/peer_hf_qwen3_5.py $c --balanced >>$OUT/peers.txt 2>&1
        echo "rc=$? ($c --balanced, limit ${left} s)" | tee -a $OUT/peers.txt
    done
    grep '^{' $OUT/peers.txt | tee -a $OUT/summary.txt ;;
esac
echo "== $(($(date +%s) - t0)) s"; cat $OUT/summary.txt
cp $OUT/summary.txt $RET/; cp $OUT/step_kernels.md $RET/ 2>/dev/null; tar czf $RET/logs.tgz -C /tmp logs
