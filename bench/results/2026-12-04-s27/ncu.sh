#!/usr/bin/env bash
# .dev-ncu/run.sh — Nsight Compute, the full set, on one launch each of the delta rule backward's state passes and
# tc_grad (bench_gpu_ops --delta, the candidate build): where their warps stall.
set -u
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for ks in tc_grad:0:1 tc_state:4:2; do
    IFS=: read k skip n <<<"$ks"
    timeout 60 $NCU --clock-control none --set full --import-source yes -k regex:$k --launch-skip $skip --launch-count $n \
        -o $OUT/$k build-cand/bench_gpu_ops --delta >$OUT/ncu_$k.log 2>&1
    echo "$k rc=$?"
    $NCU --import $OUT/$k.ncu-rep --print-details all >$OUT/ncu_$k.txt 2>&1
    grep -iE "stall|Duration|Occupancy|Warp Cycles Per Issued" $OUT/ncu_$k.txt | head -40
done
