#!/usr/bin/env bash
# lead's device script: unpack carried binaries, run the GPU suite, then the 8-layer bench natural + balanced.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" build /tmp/pithlib
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for f in .gpu/bin/*.gz; do gunzip -c "$f" > "build/$(basename "$f" .gz)"; chmod +x "build/$(basename "$f" .gz)"; done
for f in .gpu/lib/*.gz; do n=$(basename "$f" .gz); gunzip -c "$f" > /tmp/pithlib-$n; done
mkdir -p /tmp/pl; export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for i in 1 2 3 4 5; do for m in $(ldd build/pith build/test_gpu | awk '/not found/ {print $1}' | sort -u); do [ -e /tmp/pithlib-$m ] && cp /tmp/pithlib-$m /tmp/pl/$m; done; done
if ldd build/pith | grep -q "libmpi.so.40 => not found"; then export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib:$LD_LIBRARY_PATH; fi
ldd build/test_gpu | grep "not found"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
MODE=${1:-all}
if [ "$MODE" = all ] || [ "$MODE" = test ]; then
  PITH_TEST_GPU=1 timeout ${TEST_T:-300} build/test_gpu ${FILTER:-} 2>&1 | tee $OUT/test_gpu.txt | grep -E "^(PASS|FAIL|SKIP)|passed|error|Error" | head -80
fi
if [ "$MODE" = all ] || [ "$MODE" = bench ]; then
  mkdir -p /tmp/pith-bench-data; build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab ${VOCAB:-151936} --tokens 200000 --seed 1 >/dev/null
  for r in natural balanced; do
    extra=""; [ $r = balanced ] && extra="--set benchmark=true"
    rm -rf /tmp/pith-bench-run
    timeout 200 build/pith train ${BENCH:-bench/qwen3_30b_a3b_8l}/train.json --set max_steps=${STEPS:-8} $extra > $OUT/train_$r.txt 2>&1; echo "rc=$?" >> $OUT/train_$r.txt; cat /tmp/pith-bench-run/metrics.jsonl >> $OUT/train_$r.txt; python3 -c "import json,statistics,sys; R=[json.loads(l) for l in open(\"/tmp/pith-bench-run/metrics.jsonl\")][2:]; fb=statistics.median(r[\"fwdbwd_s\"] for r in R); st=statistics.median(r[\"step_time_s\"] for r in R); print(f\"fwd+bwd {fb*1e3:.1f} ms = {8192/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms\")"
    echo "== $r"; grep -E "step|error" $OUT/train_$r.txt | tail -4
  done
fi
