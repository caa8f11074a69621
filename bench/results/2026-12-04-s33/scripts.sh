# The staged helper of session 33's calls 1 and 2 (bash bench/session.sh h:pp:SECS). The binary read an experiment
# variable main never had, PITH_WG_PP (1: the ping-pong kernels, README.md); its code is not kept. Call 2's st()
# printed nothing (a Python f-string syntax error); its step times come from the train logs' step lines.

# ping-pong grouped GEMM (PITH_WG_PP=1) against the cooperative kernels, one binary
export PITH_TEST_GPU=1
ok=1
for t in gpu_op_grouped_wgmma gpu_op_grouped_linear_many gpu_op_fp8_grouped gpu_op_grouped_linear_bias; do
    PITH_WG_PP=1 timeout 40 build/test_gpu $t >$OUT/ct_${t}_1.txt 2>&1; rc=$?
    echo "PP=1 $t rc=$rc $(grep -E 'passed' $OUT/ct_${t}_1.txt | tail -1)"; [ $rc = 0 ] || ok=0
done
PITH_WG_PP=0 timeout 40 build/test_gpu gpu_op_grouped_wgmma >$OUT/ct_0.txt 2>&1; echo "PP=0 gpu_op_grouped_wgmma rc=$?"
grep -h "vs cpu\|differ\|not the\|did not" $OUT/ct_gpu_op_grouped_wgmma_1.txt | sort | uniq -c | sort -rn | head -12
[ $ok = 1 ] || { echo "PP failed: stop"; touch $OUT/ppfail; exit 1; }
g() { timeout 25 build/bench_gpu_ops --grouped wgmma $1 2>&1 | grep -v BENCH | grep balanced | grep -v "fp32" ; }
for m in qwen3 dsv2 gpt_oss; do for r in 1 2; do for pp in 0 1; do
    echo "== $m PP=$pp run $r"; PITH_WG_PP=$pp g $m
done; done; done
st() { # st NAME DIR VOCAB: 8 steps of pith, balanced, with the environment given
    rm -rf /tmp/pith-bench-run /tmp/pith-bench-data; mkdir -p /tmp/pith-bench-data
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab $3 --tokens 200000 --seed 1 >/dev/null
    timeout 70 build/pith train $2/train.json --set max_steps=8 --set benchmark=true >$OUT/train_$1.txt 2>&1
    python3 -c '
import json, statistics, sys
R = [json.loads(l) for l in open("/tmp/pith-bench-run/metrics.jsonl")]; S = R[2:]
fb = statistics.median(r["fwdbwd_s"] for r in S)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; GPU peak {max(r.get(\"gpu_peak_gb\") or 0 for r in R):.1f} GB; loss {R[0][\"loss\"]:.3f} -> {R[-1][\"loss\"]:.3f}")' "$1"
}
for m in "qwen3 bench/qwen3_30b_a3b_8l 151936" "dsv2 bench/deepseek_v2_lite_8l 102400" "gpt_oss bench/gpt_oss_20b_4l 201088"; do
    set -- $m
    PITH_WG_PP=0 st ${1}_coop $2 $3; PITH_WG_PP=1 st ${1}_pp $2 $3
done
PITH_WG_PP=1 st qwen3_pp_again bench/qwen3_30b_a3b_8l 151936; PITH_WG_PP=0 st qwen3_coop_again bench/qwen3_30b_a3b_8l 151936
