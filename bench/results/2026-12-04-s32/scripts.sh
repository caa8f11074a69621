# The staged helpers of session 32's calls (bash bench/session.sh ... h:NAME:SECONDS ran .dev-NAME/run.sh). The
# candidates of calls 1–3 read experiment variables that main never had (they are described in README.md); their
# code is not kept.

# call 1, .dev-wg/run.sh — RUNS="dsv2:balanced:main dsv2:balanced:cand qwen3:balanced:main qwen3:balanced:cand
# gpt_oss:balanced:main qwen3_5:balanced:main" bash bench/session.sh h:wg:200 bench
g() { timeout 60 "$@" 2>&1 | grep -v BENCH | grep -E "wgmma|floor" ; }
echo "== main"; g build/bench_gpu_ops --grouped wgmma
echo "== cand"; g build-cand/bench_gpu_ops --grouped wgmma
echo "== cand nostore"; PITH_WG_NOSTORE=1 g build-cand/bench_gpu_ops --grouped wgmma
echo "== cand stagger 3000x2"; PITH_WG_STAGGER=3000 PITH_WG_PHASES=2 g build-cand/bench_gpu_ops --grouped wgmma
echo "== cand stagger 1600x4"; PITH_WG_STAGGER=1600 PITH_WG_PHASES=4 g build-cand/bench_gpu_ops --grouped wgmma
echo "== cand again"; g build-cand/bench_gpu_ops --grouped wgmma
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 150 $NCU --kernel-name regex:wgmma_grouped_kernel --launch-skip 140 --launch-count 1 --set full \
    -o $OUT/wgrad build-cand/bench_gpu_ops --grouped wgmma >$OUT/ncu.txt 2>&1
$NCU --import $OUT/wgrad.ncu-rep --page details > $OUT/wgrad_details.txt 2>&1

# call 2, .dev-wg/run.sh — CFILTERS="gpu_op_grouped_wgmma gpu_op_vector_paths" RUNS="qwen3:balanced:main
# qwen3:balanced:cand dsv2:balanced:cand gpt_oss:balanced:cand" bash bench/session.sh ctest h:wg:200 bench
g() { timeout 60 "$@" 2>&1 | grep -v BENCH | grep -E "wgmma|floor" | grep -E "qwen3|dsv2.*down|gpt_oss.*weight bf16" ; }
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 60 $NCU --import .dev-wg/wgrad.ncu-rep --page source --print-source sass --csv > $OUT/sass.csv  # call 1's report
echo "== main"; g build/bench_gpu_ops --grouped wgmma
for x in 0 24 8 4 2 0; do echo "== cand XF=$x"; PITH_WG_XF=$x g build-cand/bench_gpu_ops --grouped wgmma; done

# call 3, .dev-wg/run.sh — bash bench/session.sh h:wg:420
g() { timeout 60 build-cand/bench_gpu_ops --grouped wgmma $1 2>&1 | grep -v BENCH | grep -E "balanced" | grep -v "fp32" ; }
for r in 1 2; do for x in 0 16 32 48; do echo "== qwen3 XF=$x run $r"; PITH_WG_XF=$x g qwen3; done; done
for x in 0 4 2; do echo "== qwen3 XF=$x all kinds"; PITH_WG_XF=$x g qwen3; done
for x in 0 48; do echo "== dsv2 XF=$x"; PITH_WG_XF=$x g dsv2; done
st() { # st NAME DIR VOCAB: 8 steps of the candidate's pith, balanced, with the environment given
    rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
    build-cand/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab $3 --tokens 200000 --seed 1 >/dev/null
    timeout 150 build-cand/pith train $2/train.json --set max_steps=8 --set benchmark=true >$OUT/train_$1.txt 2>&1
    python3 -c '
import json, statistics, sys
R = [json.loads(l) for l in open("/tmp/pith-bench-run/metrics.jsonl")]; S = R[2:]
fb = statistics.median(r["fwdbwd_s"] for r in S)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s")' "$1"
}
for r in 1 2; do for x in 0 48; do PITH_WG_XF=$x st qwen3_xf${x}_$r bench/qwen3_30b_a3b_8l 151936; done; done
for x in 0 48; do PITH_WG_XF=$x st dsv2_xf$x bench/deepseek_v2_lite_8l 102400; done

# call 4, .dev-ov/run.sh — RUNS="qwen3:balanced:main qwen3:balanced:cand dsv2:balanced:main dsv2:balanced:cand
# gpt_oss:balanced:cand" bash bench/session.sh h:ov:150 bench
export PITH_TEST_GPU=1
for t in gpu_op_grouped_wgmma gpu_op_vector_paths gpu_op_fp8_grouped gpu_op_grouped_linear_many gpu_op_grouped_linear_bias; do
    timeout 90 build-cand/test_gpu $t >$OUT/ct_$t.txt 2>&1; echo "cand $t rc=$? $(grep -E 'passed' $OUT/ct_$t.txt | tail -1)"
done
g() { timeout 60 "$@" 2>&1 | grep -v BENCH | grep balanced | grep -v fp32; }
for r in 1 2; do
    echo "== qwen3 cand (overlap) run $r"; g build-cand/bench_gpu_ops --grouped wgmma qwen3
    echo "== qwen3 cand NOOV run $r"; PITH_WG_NOOV=1 g build-cand/bench_gpu_ops --grouped wgmma qwen3
done
echo "== dsv2 cand (overlap)"; g build-cand/bench_gpu_ops --grouped wgmma dsv2
echo "== dsv2 cand NOOV"; PITH_WG_NOOV=1 g build-cand/bench_gpu_ops --grouped wgmma dsv2
echo "== gpt_oss cand (overlap)"; g build-cand/bench_gpu_ops --grouped wgmma gpt_oss
echo "== gpt_oss cand NOOV"; PITH_WG_NOOV=1 g build-cand/bench_gpu_ops --grouped wgmma gpt_oss
