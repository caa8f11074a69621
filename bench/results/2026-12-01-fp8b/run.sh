#!/usr/bin/env bash
# run.sh — issue 22's second device call, from the repository root with .dev-fp8b carried: bin/*.gz (pith, test_gpu,
# bench_gpu_ops built on the development machine at the commit named in README.md), lib/*.gz (the Debian libraries
# the device lacks, scripts/pack_libs.sh), run_fp8_loss.sh (bench/) and data/tokens (the King James Bible through
# `pith tokenize` with the Qwen3 tokenizer, as scripts/demo.sh builds it). In order: the FP8 GPU tests; memcheck and
# racecheck on the FP8 op tests; bench_gpu_ops --fp8 (the expert and dense FP8 GEMMs beside bf16); the 300-step loss
# comparison bf16 vs FP8 (bench/run_fp8_loss.sh). $OUT gets summary.txt as it grows, logs.tgz after each stage (a
# call stopped at its limit still returns what ran), loss.png.
set -u
RET=${OUT:-/tmp/out}; OUT=/tmp/logs; D=.dev-fp8b; mkdir -p "$RET" "$OUT" build /tmp/pl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader; date -u
for f in $D/bin/*.gz; do b=build/$(basename "$f" .gz); gunzip -c "$f" >"$b"; chmod +x "$b"; done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pithlib-$(basename "$f" .gz); done
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3 4 5; do # only the libraries the device lacks
    for m in $(ldd build/pith build/test_gpu build/bench_gpu_ops | awk '/not found/ {print $1}' | sort -u); do
        [ -e /tmp/pithlib-$m ] && cp /tmp/pithlib-$m /tmp/pl/$m
    done
done
if ldd build/pith | grep -q "libmpi.so.40 => not found"; then
    export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib:$LD_LIBRARY_PATH
fi
ldd build/test_gpu | grep "not found"
export PITH_TEST_GPU=1 PYTHONUNBUFFERED=1
S=$RET/summary.txt
pack() { tar czf $RET/logs.tgz -C /tmp logs; }
timeout 60 build/test_gpu fp8 >$OUT/test_gpu_fp8.txt 2>&1; echo "rc=$?" >>$OUT/test_gpu_fp8.txt
grep -E "^(PASS|FAIL)|passed|rc=|     " $OUT/test_gpu_fp8.txt | tee -a $S
pack
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
    timeout 40 $CS --tool $tool --error-exitcode 9 build/test_gpu gpu_op_fp8 >$OUT/$tool.txt 2>&1
    echo "$tool: rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/$tool.txt | tail -1)" | tee -a $S
    pack
done
timeout 40 build/bench_gpu_ops --fp8 >$OUT/bench_fp8_gemms.txt 2>&1; echo "rc=$?" >>$OUT/bench_fp8_gemms.txt
grep -v '^BENCH' $OUT/bench_fp8_gemms.txt | tee -a $S
pack
timeout 90 bash $D/run_fp8_loss.sh $D/data/tokens $OUT/loss 300 >$OUT/loss.txt 2>&1; echo "rc=$?" >>$OUT/loss.txt
tail -3 $OUT/loss/train_fp8.txt $OUT/loss/train_bf16.txt >>$OUT/loss.txt 2>/dev/null
tail -4 $OUT/loss.txt | tee -a $S
cp $OUT/loss/loss.png $RET/ 2>/dev/null
pack
echo "== summary"; cat $S
