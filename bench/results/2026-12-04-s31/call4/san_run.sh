# compute-sanitizer on the changed kernels: the combine through the sort's inverse, the sort, the grouped wgmma (m64n256)
for t in gpu_op_moe_combine gpu_op_moe_sort_gather_scatter gpu_op_vector_paths; do
    timeout 60 $CS --tool memcheck build/test_gpu $t 2>&1 | grep -E "ERROR SUMMARY|passed" | sed "s/^/memcheck $t: /"
done
for tool in memcheck racecheck; do
    timeout 60 $CS --tool $tool build/test_gpu gpu_op_grouped_linear_many 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed" | sed "s/^/$tool gpu_op_grouped_linear_many: /"
done
