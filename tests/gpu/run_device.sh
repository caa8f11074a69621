#!/usr/bin/env bash
# run_device.sh — one call on the GPU machine, from the repository root: `make test-gpu`, then
# compute-sanitizer memcheck and racecheck on a short subset, logs under $OUT, a summary table last.
# Options: --quick (sanitizers only on the bf16 model test), --bench (also `make bench-gpu`), --flash
# (sanitizers only on the tensor-core attention test, small shapes; RACECHECK=0 skips racecheck).
# Where the machine lacks the Debian build libraries (openblas, jansson, ...), the binaries built on the
# development machine are used as they are: carry build/ (without *.d) and lib/ (the .so files, large
# ones gzipped) — make then finds everything up to date and runs the test-gpu recipe.
set -u
OUT=${OUT:-/tmp/pith-out}
mkdir -p "$OUT"
log() { echo "== $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
if [ -d lib ]; then
    mkdir -p /tmp/pithlib
    for f in lib/*; do case "$f" in *.gz) gunzip -c "$f" >"/tmp/pithlib/$(basename "$f" .gz)" ;; *) cp "$f" /tmp/pithlib/ ;; esac; done
    export LD_LIBRARY_PATH=/tmp/pithlib:${LD_LIBRARY_PATH:-}
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then # fall back to the CUDA libraries of the Python wheels
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
if [ -e /usr/include/cblas.h ] && [ -e /usr/include/jansson.h ] && [ ! -e build/pith ]; then
    log "building here"
    make -j16 GPU=1 build/pith build/test_gpu >"$OUT/build.txt" 2>&1 || { tail -30 "$OUT/build.txt"; exit 1; }
else
    log "using the carried binaries"
    find build -type f -exec touch {} + && touch build/pith build/test_gpu
    ldd build/test_gpu | grep "not found"
fi
export PITH_TEST_GPU=1
log "make test-gpu"
t0=$(date +%s)
timeout 240 make test-gpu 2>&1 | tee "$OUT/test-gpu.txt"
rc_test=${PIPESTATUS[0]}
t1=$(date +%s)
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
quick=0 bench=0 flash=0
for a in "$@"; do case "$a" in --quick) quick=1 ;; --bench) bench=1 ;; --flash) flash=1 ;; esac; done
if [ $bench = 1 ]; then
    log "make bench-gpu"
    timeout 120 make bench-gpu 2>&1 | tee "$OUT/bench.txt"
fi
if [ $flash = 1 ]; then
    log "memcheck + racecheck (flash attention)"
    PITH_TEST_SANITIZE=1 timeout 90 "$SAN" --tool memcheck --error-exitcode 9 build/test_gpu gpu_op_attention_flash >"$OUT/memcheck-flash.txt" 2>&1
    rc_mem=$? rc_mem2=-
    rc_race=-
    if [ "${RACECHECK:-1}" = 1 ]; then
        PITH_TEST_SANITIZE=1 timeout 90 "$SAN" --tool racecheck --error-exitcode 9 build/test_gpu gpu_op_attention_flash >"$OUT/racecheck-flash.txt" 2>&1
        rc_race=$?
    fi
elif [ $quick = 1 ]; then
    log "memcheck (bf16 model)"
    timeout 60 "$SAN" --tool memcheck --error-exitcode 9 build/test_gpu gpu_model_bf16 >"$OUT/memcheck-model-bf16.txt" 2>&1
    rc_mem=$? rc_mem2=- rc_race=-
else
    log "memcheck"
    timeout 120 "$SAN" --tool memcheck --error-exitcode 9 build/test_gpu gpu_op >"$OUT/memcheck-ops.txt" 2>&1
    rc_mem=$?
    timeout 60 "$SAN" --tool memcheck --error-exitcode 9 build/test_gpu gpu_model_fp32 >"$OUT/memcheck-model.txt" 2>&1
    rc_mem2=$?
    log "racecheck"
    timeout 120 "$SAN" --tool racecheck --error-exitcode 9 build/test_gpu gpu_op >"$OUT/racecheck-ops.txt" 2>&1
    rc_race=$?
fi
t2=$(date +%s)
tail -n 4 "$OUT"/*check*.txt
echo
echo "================ summary ================"
cut -c1-220 "$OUT/test-gpu.txt" | grep -v "^\(model\|data\):"
echo "make test-gpu rc=$rc_test ($((t1 - t0))s) | memcheck ops rc=$rc_mem model rc=$rc_mem2 | racecheck ops rc=$rc_race ($((t2 - t1))s)"
grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$OUT"/*check*.txt
[ $bench = 1 ] && cat "$OUT/bench.txt"
