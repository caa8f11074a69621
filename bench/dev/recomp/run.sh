#!/usr/bin/env bash
# bench/dev/recomp/run.sh — the recompute sets on one H200 (docs/architecture.md, "Activation recomputation"), for
# bench/session.sh's helper mode (staged as .dev-recomp/run.sh; `bash bench/session.sh h:recomp:200`):
# bench/run_recompute.sh on the 8-layer Qwen3-30B-A3B benchmark (bench/qwen3_30b_a3b_8l, 2 × 4096 tokens, bf16) under
# none, selective, the elementwise parts with the router (norm,rope,swiglu,router) and every part (+ expert_out and
# gate_up: the down and gate_up GEMMs again in backward), 6 steps each: median fwd+bwd and optimizer time over steps ≥ 3, GPU peak against
# the plan. Then the plan of each set for the 48-layer model on 8 × 80 GB (pith estimate --detail's levers).
# The candidate's pith (build-cand) when there is one, else build/pith; each run under timeout RUN_T (45 s); logs
# and table.md under $OUT.
set -u
OUT=${OUT:-/tmp/h/recomp}
mkdir -p "$OUT"
pith=${PITH:-build-cand/pith}
[ -x "$pith" ] || pith=build/pith
RUN_T=${RUN_T:-45} PITH=$pith OUT=$OUT bash bench/run_recompute.sh --steps=6 --no-sweep \
    --modes="none selective norm,rope,swiglu,router norm,rope,swiglu,router,expert_out,gate_up"
for st in fp32 bf16; do
    echo "== pith estimate examples/qwen3-30b-a3b/train.json --gpus 8 --gpu-memory 80 --detail (optimizer.state_dtype=$st)"
    "$pith" estimate examples/qwen3-30b-a3b/train.json --gpus 8 --gpu-memory 80 --detail \
        --set optimizer.state_dtype=$st | grep -E '^  total|recompute=' | tee -a "$OUT/table.md"
done
