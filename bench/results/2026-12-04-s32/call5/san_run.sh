# compute-sanitizer on the changed kernels: the grouped wgmma epilogue (stmatrix) in the bf16 and the FP8 kernels
for t in gpu_op_grouped_linear_many gpu_op_fp8_grouped; do for tool in memcheck racecheck; do
    timeout 90 $CS --tool $tool build/test_gpu $t 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" | sed "s/^/$tool $t: /"
done; done
