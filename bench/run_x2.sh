#!/usr/bin/env bash
# run_x2.sh — the whole two-GPU call of the two-GPU issue in one device command (nvidia-h200-x2), inside
# 570 s so the table always prints, from the repository root, no build there:
#   1. correctness: the two-GPU suite (build/test_gpu gpu2_: NCCL, EP, ring, ep2/dp2 against one GPU)
#   2. ep2 against one GPU, and dispatch + combine against torch's all_to_all_single  (bench/run_gpu2.sh)
#   3. FSDP alone (ep 1, dp 2) beside ep2 on the same model                             (run_gpu2.sh --fsdp)
#   4. pp2 DualPipeV with 8 and 16 micro-batches and their measured bubble              (run_gpu2.sh --pp2)
#   5. cp2 at 16384 and 32768 tokens against cp1, ring time per hop                     (bench/run_cp2.sh)
#   6. every run's GPU peak against `pith estimate` for its layout (≤ 2%)               (here, from PITH_RUNS)
# On the development machine: `bash tests/gpu/pack_device2.sh` (builds and packs the binaries and the Debian
# libraries the device lacks into .gpu2/), then the device call with carry [".gpu2"] and command
# `bash bench/run_x2.sh`, timeout_s 600. Logs come back as $OUT/logs.tgz beside $OUT/summary.txt (the device
# returns at most 8 files); the table is printed last.
# --dry runs the same script here: fake GPUs (build-fake/, made by this script: device memory is host memory,
# NCCL is MPI), 2 CPU ranks, bench/pp_tiny for the model, short sequences and few tokens; the torch peer says
# "skipped (no torch)" where torch is absent. It checks the plumbing, not any figure.
set -u
dry=0
[ "${1:-}" = --dry ] && dry=1
OUT=${OUT:-/tmp/pith-out}
L=/tmp/pith-x2
rm -rf "$L" && mkdir -p "$L/out" "$OUT"
t_start=$(date +%s)
deadline=$((t_start + ${PITH_BUDGET_S:-570}))
limit() { local l=$((deadline - $(date +%s) - 20)); ((l > $1)) && l=$1; ((l < 5)) && l=5; echo $l; }
export PITH_RUNS=$L/runs.tsv
: >"$PITH_RUNS"
if [ $dry = 1 ]; then
    # the fake build's test_gpu holds only the two-GPU cases (the other GPU tests need the CUDA backend's probes)
    make -j2 fake-build >/dev/null &&
        make --no-print-directory -j2 BUILD=build-fake FAKE_CUDA=1 build-fake/bench_ep build-fake/bench_ring \
            GPU_TEST_SRC="tests/gpu/gpu_util.c tests/gpu/test_gpu_parallel.c" build-fake/test_gpu >/dev/null || exit 1
    export PITH_BUILD=build-fake PITH_Q8=bench/pp_tiny PITH_Q8_VOCAB=256 PITH_EP_TOKENS=64 PITH_CP_SEQS="128 256"
    export PITH_RING_DTYPE=fp32 PITH_RING_ITERS=2
    export PITH_Q8_SETS="--set device=cuda --set compute_dtype=fp32" OMP_NUM_THREADS=1
    export PITH_MPI="mpirun --oversubscribe --bind-to none -np 2" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
else
    # shellcheck source=../tests/gpu/run_device2.sh
    source tests/gpu/run_device2.sh --setup
    export PITH_BUILD=build
fi
B=$PITH_BUILD
export OUT=$L/out PITH_BIN=$B/pith

echo "== 1. the two-GPU suite ($B/test_gpu gpu2_)"
t0=$(date +%s)
PITH_TEST_GPU=1 timeout $(limit 200) $B/test_gpu gpu2_ >"$L/suite.txt" 2>&1
rc_suite=$?
cat "$L/suite.txt"
t1=$(date +%s)
echo "== 2-4. bench/run_gpu2.sh --baseline --fsdp --pp2"
PITH_DEADLINE=$((deadline - 170)) bash bench/run_gpu2.sh --quick --baseline --fsdp --pp2 >"$L/gpu2.txt" 2>&1
rc_gpu2=$?
cat "$L/gpu2.txt"
t2=$(date +%s)
echo "== 5. bench/run_cp2.sh"
PITH_DEADLINE=$((deadline - 30)) bash bench/run_cp2.sh >"$L/cp2.txt" 2>&1
rc_cp2=$?
cat "$L/cp2.txt"
t3=$(date +%s)

# 6. each run's GPU peak (the largest gpu_peak_gb of its steps) against the total `pith estimate` plans for the
# same config, layout and rank count (the "(N bytes)" of its plan line).
python3 - "$PITH_RUNS" "$B/pith" >"$L/memory.txt" 2>&1 <<'PY'
import json, os, shlex, subprocess, sys
runs, pith = sys.argv[1], sys.argv[2]
print(f"{'run':>12} | {'GPUs':>4} | {'GPU peak GB':>11} | {'estimate GB':>11} | {'peak/est':>8} | within 2%")
for line in open(runs):
    name, gpus, run_dir, args = line.rstrip("\n").split("\t")
    path = f"{run_dir}/metrics.jsonl"
    peak = max((json.loads(l)["gpu_peak_gb"] for l in open(path)), default=0) if os.path.exists(path) else 0
    est = subprocess.run([pith, "estimate", *shlex.split(args), "--gpus", gpus], capture_output=True, text=True)
    text = est.stdout + est.stderr
    at = text.find(" bytes)")
    if est.returncode or at < 0:
        print(f"{name:>12} | {gpus:>4} | {peak:>11.3f} | {'-':>11} | {'-':>8} | estimate failed: {text.strip()[:80]}")
        continue
    e = int(text[text.rfind("(", 0, at) + 1:at]) / 1e9
    ok = "yes" if peak and abs(peak / e - 1) <= 0.02 else "NO" if peak else "no steps" if not os.path.exists(path) \
        else "no GPU peak (fake GPUs report none)"
    ratio = f"{peak / e:.4f}" if peak else "-"
    print(f"{name:>12} | {gpus:>4} | {peak:>11.3f} | {e:>11.3f} | {ratio:>8} | {ok}")
PY
tar czf "$OUT/logs.tgz" -C "$L" . 2>/dev/null
{
    echo "================ two-GPU call: $(date -u +%FT%TZ)$([ $dry = 1 ] && echo ', --dry: fake GPUs, CPU ranks')"
    echo "1. suite rc=$rc_suite ($((t1 - t0)) s): $(grep -E '^[0-9]+ passed' "$L/suite.txt" | tail -1)"
    grep -E "^(PASS|FAIL)|skipped" "$L/suite.txt" | sort -u | cut -c1-120
    echo "2-4. run_gpu2.sh rc=$rc_gpu2 ($((t2 - t1)) s)"
    sed -n '/^EP dispatch + combine on 2 GPUs/,$p' "$L/gpu2.txt"
    grep -E "^skipped" "$L/gpu2.txt"
    grep -E "not run" "$L/cp2.txt"
    echo "5. run_cp2.sh rc=$rc_cp2 ($((t3 - t2)) s)"
    sed -n '/^Ring attention at cp2/,$p' "$L/cp2.txt"
    echo "6. GPU peak against pith estimate"
    cat "$L/memory.txt"
    echo "total $(($(date +%s) - t_start)) s"
} | tee "$OUT/summary.txt"
