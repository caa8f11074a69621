# call 6 (final tree in build/): sanitizers on the changed kernels, repeat runs of the determinism tests, op timings
CS=${CS:-compute-sanitizer}
for tk in gpu_op_delta_rule_128:tc_ gpu_op_qwen3_5_elementwise:conv_ gpu_op_qwen3_5_elementwise:gates; do
    IFS=: read t k <<<"$tk"
    for tool in memcheck racecheck; do
        timeout 100 $CS --tool $tool --kernel-name kns=$k build/test_gpu $t >$OUT/${tool}_${t}_$k.txt 2>&1
        echo "$tool $t ($k): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/${tool}_${t}_$k.txt | tr '\n' ' ')"
    done
done
for i in 1 2 3; do timeout 60 build/test_gpu gpu_det_qwen3_5 2>&1 | grep -E "^PASS|^FAIL|differ"; done
for i in 1 2; do timeout 60 build/test_gpu gpu_op_delta_rule_repeat 2>&1 | grep -E "^PASS|^FAIL"; done
timeout 60 build/bench_gpu_ops --delta 2>&1 | grep -v BENCH
timeout 60 build/bench_gpu_ops --conv 2>&1 | grep -v BENCH
