#!/usr/bin/env bash
# run_device2.sh — one call on a two-GPU machine (nvidia-h200-x2), from the repository root, no build: the
# two-GPU suite (build/test_gpu gpu2_: NCCL collectives, EP, timeouts, ep2/dp2 equivalence in fp32 and bf16),
# then bench/run_gpu2.sh (EP dispatch + combine vs torch all_to_all_single; the 8-layer Qwen3-30B-A3B at
# ep2), logs under $OUT, a summary table last. Options go to run_gpu2.sh (--quick, --baseline); --x8 runs
# bench/run_x8.sh (issue 8, 8 GPUs) instead of both.
# The binaries come from .gpu2/ (tests/gpu/pack_device2.sh on the development machine: stripped, gzipped,
# with the Debian libraries the device lacks); only libraries the device cannot resolve itself are put on
# LD_LIBRARY_PATH, Open MPI and CUDA/NCCL are the device's own (NCCL from PyTorch's wheel if
# /usr/local/cuda has none). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
# `source tests/gpu/run_device2.sh --setup` (bench/run_x2.sh) only unpacks and sets the environment, then returns.
set -u
OUT=${OUT:-/tmp/pith-out}
mkdir -p "$OUT"
log() { echo "== $*"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none # CMA is often refused inside VMs and containers
t_start=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
echo "mpirun: $(command -v mpirun) $(mpirun --version 2>/dev/null | head -1)"
[ -f .gpu2/BUILT ] && cat .gpu2/BUILT

if [ -d .gpu2/bin ]; then
    log "unpacking the carried binaries into build/"
    mkdir -p build /tmp/pithlib-all /tmp/pithlib
    for f in .gpu2/bin/*.gz; do gunzip -c "$f" >"build/$(basename "$f" .gz)" && chmod +x "build/$(basename "$f" .gz)"; done
    for f in .gpu2/lib/*.gz; do [ -e "$f" ] && gunzip -c "$f" >"/tmp/pithlib-all/$(basename "$f" .gz)"; done
fi
for b in pith test_gpu test_parallel bench_ep bench_ring; do [ -x "build/$b" ] || { echo "build/$b is missing: run tests/gpu/pack_device2.sh and carry .gpu2"; exit 1; }; done
# CUDA and NCCL: /usr/local/cuda's, else the Python wheels' (as run_device.sh does).
if ldd build/pith | grep -q "lib\(cublasLt\|cudart\|nccl\).* not found"; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu13/lib; do
        [ -d "$d" ] && export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d
    done
fi
# Open MPI: the libmpi beside the device's mpirun when the loader does not find one (the carried binaries
# were linked against Open MPI 4.1; libmpi.so.40 keeps its ABI across 4.x).
if ldd build/pith | grep -q "libmpi.so.40 => not found"; then
    export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# The carried libraries, only those the device does not resolve (its own stay first for everything else).
for i in 1 2 3 4; do
    missing=$(for b in pith test_gpu test_parallel bench_ep bench_ring; do ldd "build/$b"; done | awk '/not found/ {print $1}' | sort -u)
    [ -z "$missing" ] && break
    for m in $missing; do [ -e "/tmp/pithlib-all/$m" ] && cp "/tmp/pithlib-all/$m" /tmp/pithlib/; done
    export LD_LIBRARY_PATH=/tmp/pithlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
done
echo "libraries: $(ls /tmp/pithlib 2>/dev/null | tr '\n' ' ')(carried)"
ldd build/pith | grep -E "libmpi|libnccl|libcudart|not found"
if ldd build/pith | grep -q "not found"; then echo "unresolved libraries: stopping"; exit 1; fi
[ "${1:-}" = --setup ] && return 0

# --x8: issue 8's full-node run instead of the two-GPU benchmarks (bench/run_x8.sh; the pack carries the
# demo's tokens as data/demo/tokens).
if [ "${1:-}" = --x8 ]; then
    [ -d .gpu2/data/demo/tokens ] && mkdir -p data/demo && rm -rf data/demo/tokens && cp -r .gpu2/data/demo/tokens data/demo/
    log "full-node run (bench/run_x8.sh)"
    bash bench/run_x8.sh 2>&1 | tee "$OUT/x8.txt"
    exit "${PIPESTATUS[0]}"
fi
log "two-GPU suite (build/test_gpu gpu2_)"
t0=$(date +%s)
PITH_TEST_GPU=1 timeout 240 build/test_gpu gpu2_ 2>&1 | tee "$OUT/test-gpu2.txt"
rc_test=${PIPESTATUS[0]}
t1=$(date +%s)
log "benchmarks (bench/run_gpu2.sh $*)"
PITH_DEADLINE=$((t_start + 570)) bash bench/run_gpu2.sh "$@" 2>&1 | tee "$OUT/bench-gpu2.txt"
rc_bench=${PIPESTATUS[0]}
t2=$(date +%s)

echo
echo "================ summary ================"
grep -E "^(PASS|FAIL)|passed|^     " "$OUT/test-gpu2.txt" | cut -c1-220
echo "test-gpu2 rc=$rc_test ($((t1 - t0)) s) | run_gpu2.sh rc=$rc_bench ($((t2 - t1)) s)"
sed -n '/^EP dispatch + combine on 2 GPUs/,$p' "$OUT/bench-gpu2.txt"
