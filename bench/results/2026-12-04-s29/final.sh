# compute-sanitizer on the session's changed kernels (the wgmma weight gradient in bf16 and its epilogue loads, the
# moe_sort passes, the delta rule with its kept state), the fixed gpu_step_no_host_sync, the delta_rule_keep tests
CS=${CS:-compute-sanitizer}
for t in gpu_step_no_host_sync gpu_op_delta_rule_repeat gpu_det_qwen3_5_moe_keep gpu_model_qwen3_5_moe; do
    timeout 90 build/test_gpu $t 2>&1 | grep -E "host waits|^PASS|^FAIL|differ|keep"
done
for tk in gpu_op_grouped_wgmma:wgmma_grouped gpu_op_moe_sort_gather_scatter:moe_sort; do
    IFS=: read t k <<<"$tk"
    for tool in memcheck racecheck; do
        PITH_TEST_SANITIZE=1 timeout 75 $CS --tool $tool --kernel-name kns=$k build/test_gpu $t >$OUT/${tool}_$t.txt 2>&1
        echo "$tool $t ($k): rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/${tool}_$t.txt | tr '\n' ' ')"
    done
done
