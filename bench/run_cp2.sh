#!/usr/bin/env bash
# run_cp2.sh — context parallelism on two GPUs (prepared for the two-GPU issue; not run yet), from the repository
# root of a machine with two GPUs and the built binaries (build/pith, build/bench_ring):
#   1. build/bench_ring at cp2: zigzag ring attention forward and backward at Qwen3-30B-A3B's attention shape
#      (32 query heads on 4 kv heads of 128, bf16, one sequence of S = 16384 and 32768) — ring time per hop
#      against the attention op alone on one hop's blocks (the overlap target: ring ≤ 1.1 × kernel).
#   2. bench/qwen3_30b_a3b_8l (Qwen3-30B-A3B cut to 8 layers, natural routing) with one sequence of S tokens per
#      micro-batch: cp2 on 2 GPUs (S/2 tokens per GPU) against cp1 on one GPU (S tokens): tokens/s per GPU over
#      forward+backward and GPU peak memory, medians of steps 3.. (bench/report.py's count).
# Options: --quick (S = 16384 only, 4 steps). Work files under /tmp/pith-cp2, results copied to $OUT; a table last.
# Environment as bench/run_gpu2.sh's (PITH_BUILD, PITH_MPI, PITH_Q8, PITH_Q8_VOCAB, PITH_Q8_SETS, PITH_RUNS), and PITH_CP_SEQS
# (the sequence lengths, default "16384 32768"; bench/run_x2.sh --dry sets short ones), PITH_RING_DTYPE (fp32 on
# fake GPUs) and PITH_RING_ITERS.
set -u
OUT=${OUT:-/tmp/pith-out}
W=/tmp/pith-cp2
mkdir -p "$W" "$OUT"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${PITH_BUILD:-build}
MPI=${PITH_MPI:-mpirun --bind-to none -np 2}
Q8=${PITH_Q8:-bench/qwen3_30b_a3b_8l}
deadline=${PITH_DEADLINE:-$(($(date +%s) + 540))}
limit() { local l=$((deadline - $(date +%s) - 20)); ((l > $1)) && l=$1; ((l < 5)) && l=5; echo $l; }
seqs=${PITH_CP_SEQS:-16384 32768} steps=6
for a in "$@"; do case "$a" in --quick) seqs=${seqs%% *} steps=4 ;; esac; done

echo "== ring attention at cp2 ($B/bench_ring, S = $seqs)"
timeout $(limit 150) $MPI $B/bench_ring --seq "${seqs// /,}" --iters ${PITH_RING_ITERS:-10} ${PITH_RING_DTYPE:+--dtype $PITH_RING_DTYPE} 2>&1 | tee "$W/bench_ring.log"
grep '^{' "$W/bench_ring.log" >"$W/bench_ring.jsonl"

# train NAME GPUS ARGS...: one run into $W/NAME (log $W/NAME.log), recorded in PITH_RUNS (as run_gpu2.sh's).
train() {
    local name=$1 gpus=$2 launch=""
    shift 2
    ((gpus > 1)) && launch=$MPI
    rm -rf "${W:?}/$name"
    [ -n "${PITH_RUNS:-}" ] && printf '%s\t%s\t%s\t%s\n' "$name" "$gpus" "$W/$name" "$q8 $*" >>"$PITH_RUNS"
    timeout $(limit 240) $launch $B/pith train $q8 "$@" --set run_dir="$W/$name" >"$W/$name.log" 2>&1
    grep -E "^(mesh|plan|step|done)|error" "$W/$name.log"
    cp "$W/$name/metrics.jsonl" "$OUT/$name-metrics.jsonl" 2>/dev/null
}
[ -s "$W/q8data.bin" ] || $B/pith synth --output "$W/q8data.bin" --vocab ${PITH_Q8_VOCAB:-151936} --tokens 400000 >/dev/null
# the GPU's memory in GB for the fit check (PITH_GPU_GB, else nvidia-smi's; none: every run is tried)
gpu_gb=${PITH_GPU_GB:-$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null |
    awk '{printf "%d", $1 * 1048576 / 1e9}')}
for S in $seqs; do
    q8="$Q8/train.json --set dataset=$W/q8data.bin --set max_steps=$steps --set parallel.timeout_s=300 ${PITH_Q8_SETS:-}"
    q8="$q8 --set sequence_length=$S --set micro_batch_size=1 --set global_batch_size=1"
    echo "== Qwen3-30B-A3B, 8 layers, one sequence of $S tokens: cp2 on 2 GPUs"
    train cp2-$S 2 --set parallel.context_parallel_size=2
    echo "== the same on one GPU (cp1)"
    # a plan larger than the GPU is not run (at 32768 tokens cp1 plans about 148 GB against the H200's 141)
    if [ -n "$gpu_gb" ] && $B/pith estimate $q8 --gpus 1 --gpu-memory "$gpu_gb" 2>&1 | grep -q "does not fit"; then
        echo "cp1-$S: not run: pith estimate: $($B/pith estimate $q8 --gpus 1 --gpu-memory "$gpu_gb" 2>&1 | grep -m1 'does not fit')"
    else train cp1-$S 1; fi
done
cp "$W/bench_ring.jsonl" "$OUT/" 2>/dev/null
python3 - "$W" "$seqs" <<'PY'
import json, os, statistics, sys
W, seqs = sys.argv[1], [int(s) for s in sys.argv[2].split()]
def lines(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
print()
print("Ring attention at cp2, Qwen3-30B-A3B attention (32/4 heads of 128, bf16), ms per hop")
print(f"{'S':>6} | {'ring fwd':>9} {'kernel':>7} {'ratio':>6} | {'ring bwd':>9} {'kernel':>7} {'ratio':>6}")
for r in lines(f"{W}/bench_ring.jsonl"):
    print(f"{r['S']:>6} | {r['ring_fwd_hop_ms']:>9.3f} {r['kernel_fwd_hop_ms']:>7.3f} {r['fwd_ratio']:>6.2f} | "
          f"{r['ring_bwd_hop_ms']:>9.3f} {r['kernel_bwd_hop_ms']:>7.3f} {r['bwd_ratio']:>6.2f}")
print()
print("Qwen3-30B-A3B 8 layers, one sequence per step: tokens/s per GPU (forward+backward), GPU peak GB")
print(f"{'S':>6} | {'cp2 tok/s/GPU':>13} {'peak':>6} | {'cp1 tok/s':>10} {'peak':>6}")
for S in seqs:
    row = []
    for r, gpus in (("cp2", 2), ("cp1", 1)):
        m = lines(f"{W}/{r}-{S}/metrics.jsonl")
        late = [s for s in m if s["step"] >= 3] or m
        if not late:
            row += ["-", "-"]
            continue
        fb = statistics.median(s["fwdbwd_s"] for s in late)
        row += [f"{S / gpus / fb:,.0f}", f"{max(s['gpu_peak_gb'] for s in m):.1f}"]
    print(f"{S:>6} | {row[0]:>13} {row[1]:>6} | {row[2]:>10} {row[3]:>6}")
PY
