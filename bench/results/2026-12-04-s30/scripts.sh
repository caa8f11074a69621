timeout 60 build-cand/bench_gpu_ops --ce 2>&1 | grep -v BENCH
# the candidate's step profiled (profile-gpu-step), balanced: GPT-OSS and DeepSeek-V2-Lite, into $OUT/NAME
mkdir -p /tmp/pith-agents-bin/feature && cp build-cand/pith /tmp/pith-agents-bin/feature/
root=$OUT
for nv in gpt_oss_20b_4l:201088 deepseek_v2_lite_8l:102400; do
    mkdir -p $root/${nv%%:*}
    BENCH=bench/${nv%%:*} VOCAB=${nv#*:} BALANCED=1 OUT=$root/${nv%%:*} bash .agents/skills/profile-gpu-step/run.sh | tail -14
done
# Nsight Compute on the one-pass cross-entropy (bench_gpu_ops --ce, Qwen3.s vocabulary row): throughput, occupancy,
# warp stalls
NCU=/usr/local/cuda/bin/ncu
timeout 150 $NCU --kernel-name regex:cross_entropy_fused --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
    build-cand/bench_gpu_ops --ce >$OUT/ncu_ce.txt 2>&1
echo "ncu rc=$?"
grep -E "Duration|Throughput|Occupancy|Stall|Warp Cycles|Registers|Block Limit|Waves|Issued|Eligible|Active Warps|Cluster" $OUT/ncu_ce.txt | head -60
