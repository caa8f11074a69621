#!/usr/bin/env bash
# session.sh MODE... — a device call made of modes, from the repository root with .gpu carried: main's stripped binaries
# (.gpu/bin/*.gz or *.xz), a candidate tree's (.gpu/cand/: a candidate branch, named in .gpu/BUILT) and the
# libraries the device lacks (.gpu/lib, scripts/pack_libs.sh): bench/stage.sh packs each. Logs go to /tmp/logs; $OUT/summary.txt and
# $OUT/logs.tgz are rewritten after every mode, so a call cut short still returns what it finished.
# MODEs, in the order given:
#   test        main's whole GPU suite (build/test_gpu), also written as it runs to $OUT/test_gpu.txt
#   ctest       the candidate's GPU tests (main's when no candidate is staged) of what its diffs change (CFILTERS:
#               test-name substrings — each runs every test whose name holds it, e.g. gpu_train_tracks_cpu also the
#               _demo one — under timeout CTEST_T, 120 s)
#   csan        compute-sanitizer memcheck + racecheck on the candidate's (or main's) changed kernels (CSAN: tests; with
#               PITH_TEST_SANITIZE=1, the tests' smaller shapes; each under timeout CSAN_T, 120 s)
#   ops         bench_gpu_ops --delta, --conv and --grouped, main and candidate, + bench/peer_grouped.py (OPS: other
#               bench_gpu_ops modes instead, e.g. OPS=--fp8, without the peer)
#   docs        the candidate's bench_gpu_ops --docs: attention fwd+bwd at 2 × 4096 with and without document masking
#   bench       pith train, 8 steps, on each NAME:ROUTING:BIN[:fp8|:KEY=VALUE[,KEY=VALUE…]] in RUNS (BIN main, cand
#               or another NAME staged as .gpu/NAME/; 2 × 4096 tokens); NAME qwen3, dsv2, gpt_oss, qwen3_5 or small
#               (bench/qwen3_moe_101m: 4 layers of width 512, two micro-batches of 4 × 1024, a step the host's launches
#               can bound); a KEY env.VAR sets the environment variable VAR for that run alone (an experiment
#               variable of a candidate), any other KEY the config key; each run under timeout TRAIN_T (default 150 s)
#   peers       the issue's peers one after another, each under timeout PEER_T (default 300 s): PEERS, a list of
#               bench/peer_*.py invocations separated by ';' (default: HF transformers + torch.compile, balanced, for
#               the four bench models); their JSON lines go to the summary
#   peer35      HF transformers on bench/qwen3_5_8l's shapes, balanced: PEER35_MODES (default eager; also compile,
#               compile-layers), each under timeout PEER35_T
#   peerbg      starts the peer PEERBG (a bench/peer_*.py with its arguments; default the Qwen3.5 one, per-layer
#               compile, balanced) in the background: it compiles and warms up beside what follows, then waits for
#               /tmp/quiet before its timed steps (PEER_WAIT_FILE)
#   peerwait    waits up to PEERWAIT_T s for that peer's warm-up, then lets it time its steps alone (or stops it)
#   fp8loss     bench/run_fp8_loss.sh on .gpu/kjv/tokens (the King James Bible, Qwen3 tokens) with force-balanced
#               routing (EXTRA="--set benchmark=true $FP8LOSS_EXTRA"), 300 steps bf16 and FP8 for each of SEEDS,
#               JOBS runs at once (FP8LOSS_BIN=build-cand: the candidate's pith), under timeout FP8LOSS_T (150 s);
#               issue 36's study: SEEDS="$(seq 1 16)" JOBS=6 FP8LOSS_EXTRA="--set deterministic=true" FP8LOSS_T=540
#   prof        profile-gpu-step (.agents/skills/profile-gpu-step) on main's build (PROF_BIN: another, e.g. build-cand),
#               force-balanced, for each model in PROF (default qwen3; qwen3, dsv2, gpt_oss, qwen3_5; NAME:fp8 with fp8
#               on): that pith and
#               kernel_events.so (staged in .gpu/bin beside the others: gcc -O2 -shared -fPIC
#               -I/usr/local/cuda/include -o kernel_events.so .agents/skills/profile-gpu-step/kernel_events.c -ldl,
#               then xz) as the skill's feature build; each model's
#               table and files under $OUT/prof_NAME, returned as $RET/prof.tgz
#   ncu         Nsight Compute (NCU_SECT, default --set full; clocks left alone) on NCU_COUNT (1) launches of kernels
#               matching NCU_K (a regex on demangled names: wgmma_grouped_kernel<2 picks a template kind; default
#               wgmma_fp8_kernel) after NCU_SKIP (3) of them, in bench_gpu_ops NCU_ARGS (--fp8) of each build in
#               NCU_BUILDS (build build-cand: any build-NAME staged): the details page per build and, for one launch,
#               the per-instruction source page (SASS, stall samples), their tables (bench/ncu_table.py) in the
#               summary; the reports returned as $RET/ncu.tgz
#   helpers     each helper's staged script, HELPERS="NAME:SECONDS …": OUT=/tmp/h/NAME timeout SECONDS bash
#               .dev-NAME/run.sh, returned as $OUT/NAME.tgz (with the environment set here); h:NAME:SECONDS one
#   env:V=X,…   exports V=X … for the modes after it, until the next env: (env: alone: back to none) — e.g. the
#               candidates' switches for ctest, then env: before bench, whose RUNS set them run by run
set -u
RET=${OUT:-/tmp/out}; OUT=/tmp/logs; D=.gpu; mkdir -p "$RET" "$OUT" build build-cand /tmp/pl
cat $D/BUILT 2>/dev/null | tee $OUT/summary.txt
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader | tee -a $OUT/summary.txt
date -u | tee -a $OUT/summary.txt
unpack() { # unpack DIR PREFIX: each DIR/NAME.gz or NAME.xz (xz: a third smaller) into PREFIXNAME
    for f in $1/*.gz $1/*.xz; do
        [ -e "$f" ] || continue
        n=${f##*/}; n=$2${n%.*}
        case $f in
        *.xz) xz -dc "$f" >"$n" 2>/dev/null ||
            python3 -c 'import lzma, sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())' "$f" >"$n" ;;
        *) gunzip -c "$f" >"$n" ;;
        esac
    done
}
unpack $D/bin build/; [ -d $D/cand ] && unpack $D/cand build-cand/
for x in $D/*/; do # any other build, .gpu/NAME/ → build-NAME/ (bench's BIN NAME)
    x=$(basename $x); case $x in bin | cand | lib | kjv) ;; *) mkdir -p build-$x && unpack $D/$x build-$x/ ;; esac
done
chmod +x build/* build-*/* 2>/dev/null
unpack $D/lib /tmp/pithlib-
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
BINS=$(ls build/test_gpu build/pith build-cand/test_gpu build-cand/pith 2>/dev/null)
for i in 1 2 3 4 5; do # only the libraries the device lacks
    for m in $(for b in $BINS; do ldd $b; done | awk '/not found/ {print $1}' | sort -u); do
        [ -e /tmp/pithlib-$m ] && cp /tmp/pithlib-$m /tmp/pl/$m
    done
done
if ldd $BINS | grep -q "libmpi.so.40 => not found"; then
    export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib:$LD_LIBRARY_PATH
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
ldd $BINS | grep "not found"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PITH_TEST_GPU=1 PYTHONUNBUFFERED=1
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
ret() { cp $OUT/summary.txt $RET/; tar czf $RET/logs.tgz -C /tmp logs; }
train() { # train NAME BIN DIR VOCAB EXTRA...: 8 steps; fwd+bwd and optimizer medians over steps >= 3, the GPU peak
    local n=$1 bin=$2 dir=$3 vocab=$4 k=2; shift 4
    while [ -e $OUT/train_$n.txt ]; do n=${n%_run*}_run$k; k=$((k + 1)); done # a repeated run keeps its own log
    [ -e $dir/train.json ] || { echo "$n: no $dir" | tee -a $OUT/summary.txt; return; }
    rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
    $bin/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab $vocab --tokens 200000 --seed 1 >/dev/null
    timeout ${TRAIN_T:-150} $bin/pith train $dir/train.json --set max_steps=8 "$@" >$OUT/train_$n.txt 2>&1
    echo "rc=$?" >>$OUT/train_$n.txt; cat /tmp/pith-bench-run/metrics.jsonl >>$OUT/train_$n.txt 2>/dev/null
    python3 - "$n" <<'PY' 2>&1 | tail -1 | tee -a $OUT/summary.txt
import json, statistics, sys
R = [json.loads(l) for l in open('/tmp/pith-bench-run/metrics.jsonl')]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
peak = max((r.get('gpu_peak_gb') or 0) for r in R)
host = f" (issued in {statistics.median(r['fwdbwd_host_s'] for r in S)*1e3:.1f})" if 'fwdbwd_host_s' in S[0] else ""
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms{host} = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; "
      f"GPU peak {peak:.1f} GB; loss {R[0]['loss']:.3f} -> {R[-1]['loss']:.3f}")
PY
}
helper() { # helper NAME SECONDS: .dev-NAME/run.sh under a time limit, its $OUT returned as $RET/NAME.tgz
    local n=$1 t=$2 s0=$(date +%s); mkdir -p /tmp/h/$n
    [ -e .dev-$n/run.sh ] || { echo "helper $n: no .dev-$n/run.sh" | tee -a $OUT/summary.txt; return; }
    OUT=/tmp/h/$n CS=$CS timeout -k 5 $t bash .dev-$n/run.sh >/tmp/h/$n/stdout.txt 2>&1
    echo "helper $n: rc=$? in $(( $(date +%s) - s0 )) s" | tee -a $OUT/summary.txt
    pkill -9 -x pith && sleep 2 # a timed-out run's pith checkpoints on SIGTERM and outlives the script: free its GPU
    tail -25 /tmp/h/$n/stdout.txt | sed "s/^/  $n| /" >>$OUT/summary.txt
    tar czf $RET/$n.tgz -C /tmp/h $n; ret
}
declare -A dir=([qwen3]=bench/qwen3_30b_a3b_8l [gpt_oss]=bench/gpt_oss_20b_4l [qwen3_5]=bench/qwen3_5_8l
    [dsv2]=bench/deepseek_v2_lite_8l [small]=bench/qwen3_moe_101m)
declare -A vocab=([qwen3]=151936 [gpt_oss]=201088 [qwen3_5]=248320 [dsv2]=102400 [small]=151936)
CB=build-cand; [ -x build-cand/test_gpu ] || CB=build # ctest, csan: main's own when no candidate is staged
ENVSET=""                                             # the variables an env: mode set
for mode in "$@"; do case $mode in
test)
    # straight into the returned folder as well, so a call cut short still brings back the tests that ran
    timeout ${TEST_T:-540} build/test_gpu ${FILTER:-} 2>&1 | tee $RET/test_gpu.txt >$OUT/test_gpu.txt
    echo "rc=${PIPESTATUS[0]}" | tee -a $RET/test_gpu.txt >>$OUT/test_gpu.txt
    grep -E "^FAIL|^SKIP|passed|rc=" $OUT/test_gpu.txt | tee -a $OUT/summary.txt ;;
ctest)
    for f in ${CFILTERS:-gpu_op_delta_rule gpu_op_qwen3_5 gpu_model_qwen3_5 gpu_op_grouped_wgmma gpu_op_elementwise gpu_model_bf16 gpu_train_tracks_cpu}; do
                PITH_BIN=$CB/pith timeout ${CTEST_T:-120} $CB/test_gpu $f >$OUT/ctest_$f.txt 2>&1; echo "rc=$?" >>$OUT/ctest_$f.txt
        grep -E "^FAIL|^SKIP|passed|rc=" $OUT/ctest_$f.txt | sed "s/^/cand $f: /" | tee -a $OUT/summary.txt
    done ;;
csan)
    for t in ${CSAN:-gpu_op_delta_rule gpu_op_grouped_wgmma}; do for tool in memcheck racecheck; do
                PITH_BIN=$CB/pith PITH_TEST_SANITIZE=1 timeout ${CSAN_T:-120} $CS --tool $tool $CB/test_gpu $t >$OUT/${tool}_$t.txt 2>&1
        echo "rc=$?" >>$OUT/${tool}_$t.txt
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|rc=" $OUT/${tool}_$t.txt | sed "s/^/cand $tool $t: /" | tee -a $OUT/summary.txt
    done; done ;;
ops)
        for b in build $([ $CB = build-cand ] && echo build-cand); do for w in ${OPS:---delta --conv --grouped}; do
        timeout 60 $b/bench_gpu_ops $w >$OUT/ops_${b}$w.txt 2>&1; echo "rc=$?" >>$OUT/ops_${b}$w.txt
        grep -v BENCH $OUT/ops_${b}$w.txt | sed "s|^|$b $w: |" | tee -a $OUT/summary.txt
    done; done
    if [ -z "${OPS:-}" ]; then # the grouped peer with the default set only
        (cd bench && timeout 90 python3 peer_grouped.py >$OUT/peer_grouped.txt 2>&1; echo "rc=$?" >>$OUT/peer_grouped.txt)
        tail -12 $OUT/peer_grouped.txt | sed 's/^/peer_grouped: /' | tee -a $OUT/summary.txt
    fi ;;
docs)
    timeout ${DOCS_T:-180} build-cand/bench_gpu_ops --docs >$OUT/docs.txt 2>&1; echo "rc=$?" >>$OUT/docs.txt
    grep -v BENCH $OUT/docs.txt | sed 's/^/docs: /' | tee -a $OUT/summary.txt ;;
bench)
    for nrb in ${RUNS:-qwen3:balanced:main qwen3:natural:main}; do
        IFS=: read n r b x <<<"$nrb"; a=(); e=(); [ $r = balanced ] && a=(--set benchmark=true)
        [ "$x" = fp8 ] && a+=(--set fp8=true)
        [[ "$x" == *=* ]] && for kv in ${x//,/ }; do # NAME:ROUTING:BIN:KEY=VALUE[,KEY=VALUE], env.VAR=VALUE
            case $kv in env.*) e+=("${kv#env.}") ;; *) a+=(--set "$kv") ;; esac
        done
        bin=build; [ $b != main ] && bin=build-$b
        (for v in "${e[@]}"; do export "$v"; done; train ${n}_${r}_$b${x:+_$x} $bin ${dir[$n]} ${vocab[$n]} "${a[@]}")
        ret
    done ;;
peer35)
    for c in ${PEER35_MODES:-eager}; do
        f=--$c; [ $c = eager ] && f=
        timeout ${PEER35_T:-200} python3 bench/peer_hf_qwen3_5.py $f --balanced >>$OUT/peer35.txt 2>&1
        echo "rc=$? ($c --balanced)" >>$OUT/peer35.txt
    done
    grep -E '^\{|rc=' $OUT/peer35.txt | tee -a $OUT/summary.txt ;;
peers)
    IFS=';' read -ra P <<<"${PEERS:-peer_hf_qwen3_moe.py --compile --balanced;peer_hf_deepseek_v2.py --compile --balanced;peer_hf_gpt_oss.py --compile --balanced;peer_hf_qwen3_5.py --compile-layers --balanced}"
    for p in "${P[@]}"; do
        echo "== $p" >>$OUT/peers.txt; t0=$(date +%s)
        (cd bench && timeout ${PEER_T:-300} python3 $p) >>$OUT/peers.txt 2>&1
        echo "peer $p: rc=$? in $(( $(date +%s) - t0 )) s" | tee -a $OUT/summary.txt
        grep -E '^\{' $OUT/peers.txt | tail -1 | tee -a $OUT/summary.txt; ret
    done ;;
peerbg)
    rm -f /tmp/quiet; t0=$(date +%s); echo "peerbg: ${PEERBG:=bench/peer_hf_qwen3_5.py --compile-layers --balanced}" >$OUT/peerbg.txt
    (cd bench && PEER_WAIT_FILE=/tmp/quiet exec timeout 900 python3 ${PEERBG#bench/}) >>$OUT/peerbg.txt 2>&1 &
    PEERBG_PID=$! ;;
peerwait)
    for i in $(seq ${PEERWAIT_T:-60}); do grep -q "warm-up done" $OUT/peerbg.txt && break; sleep 1; done
    if grep -q "warm-up done" $OUT/peerbg.txt; then
        echo "peer warm-up (compile) done $(( $(date +%s) - t0 )) s after its start" | tee -a $OUT/summary.txt
        touch /tmp/quiet; timeout 120 tail --pid=$PEERBG_PID -f /dev/null
    else
        echo "peer: compile and warm-up not done $(( $(date +%s) - t0 )) s after its start: stopped" | tee -a $OUT/summary.txt
        kill $PEERBG_PID 2>/dev/null; wait $PEERBG_PID 2>/dev/null
    fi
    grep -E '^\{|Error|error' $OUT/peerbg.txt | tail -3 | tee -a $OUT/summary.txt ;;
fp8loss)
    PITH=${FP8LOSS_BIN:-build}/pith EXTRA="--set benchmark=true ${FP8LOSS_EXTRA:-}" timeout ${FP8LOSS_T:-150} \
        bash bench/run_fp8_loss.sh .gpu/kjv/tokens $OUT/fp8loss >$OUT/fp8loss.txt 2>&1; echo "rc=$?" >>$OUT/fp8loss.txt
    tail -3 $OUT/fp8loss.txt | tee -a $OUT/summary.txt ;;
prof)
    rm -rf .dev-agents && mkdir -p .dev-agents/feature && echo "feature: ${PROF_BIN:-build}'s pith (session.sh prof)" >.dev-agents/BUILT
    gzip -1c ${PROF_BIN:-build}/pith >.dev-agents/feature/pith.gz
    gzip -1c build/kernel_events.so >.dev-agents/feature/kernel_events.so.gz
    for nf in ${PROF:-qwen3}; do # NAME or NAME:fp8
        n=${nf%:fp8} x=; [ "$nf" != "$n" ] && x="--set fp8=true" n=${n}_fp8
        b=${PROF_BIN:-build}; n=$n${b#build}
        mkdir -p $OUT/prof_$n
        BENCH=${dir[${nf%:fp8}]} VOCAB=${vocab[${nf%:fp8}]} BALANCED=1 EXTRA="$x" OUT=$OUT/prof_$n timeout ${PROF_T:-200} \
            bash .agents/skills/profile-gpu-step/run.sh >$OUT/prof_$n/stdout.txt 2>&1
        echo "prof $n: rc=$?" | tee -a $OUT/summary.txt
        grep -E "^sum of timed|^GPU idle|profile-gpu-step:" $OUT/prof_$n/stdout.txt | sed "s/^/  prof $n| /" >>$OUT/summary.txt
        tar czf $RET/prof.tgz -C $OUT $(cd $OUT && ls -d prof_*); ret
    done ;;
helpers) for nt in ${HELPERS:-}; do helper ${nt%%:*} ${nt#*:}; done ;;
ncu)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); mkdir -p $OUT/ncu
    for b in ${NCU_BUILDS:-build build-cand}; do
        r=$OUT/ncu/${b}_$(echo "${NCU_K:-wgmma_fp8_kernel}${NCU_ARGS:-}" | tr -c 'A-Za-z0-9_\n' _)
        timeout ${NCU_T:-120} $NCU --clock-control none --kernel-name-base demangled \
            -k "regex:${NCU_K:-wgmma_fp8_kernel}" --launch-skip ${NCU_SKIP:-3} --launch-count ${NCU_COUNT:-1} \
            ${NCU_SECT:---set full} --import-source yes -o $r -f $b/bench_gpu_ops ${NCU_ARGS:---fp8} >$r.log 2>&1
        echo "ncu $b: rc=$?" | tee -a $OUT/summary.txt
        $NCU --import $r.ncu-rep --page details >$r.txt 2>&1
        [ ${NCU_COUNT:-1} = 1 ] && $NCU --import $r.ncu-rep --page source --csv --print-source sass >$r.sass.csv 2>&1
        python3 bench/ncu_table.py $r.txt $([ -e $r.sass.csv ] && echo $r.sass.csv) 2>&1 | sed "s|^|ncu $b: |" |
            tee -a $OUT/summary.txt
    done
    tar czf $RET/ncu.tgz -C $OUT ncu ;;
h:*) nt=${mode#h:}; helper ${nt%%:*} ${nt#*:} ;;
env:*) # the variables for the modes after it (env: alone: none of them again)
    for v in $ENVSET; do unset ${v%%=*}; done
    ENVSET=$(echo ${mode#env:} | tr , ' ')
    for v in $ENVSET; do export "$v"; done
    echo "environment for the next modes: ${ENVSET:-(none)}" | tee -a $OUT/summary.txt ;;
esac; ret; done
echo "== summary"; cat $OUT/summary.txt
