#!/usr/bin/env bash
# run_fp8_loss.sh TOKENS OUT [STEPS] — issue 22's loss comparison: the demo's Qwen3-MoE scaled up (qwen3_moe_101m/:
# hidden 512, 4 layers, 16 experts top-2 of width 256, layer 0 a dense MLP of 1024; every projection and the experts
# in FP8 on the tensor cores: cuBLASLt's block-scaled GEMMs and our wgmma E4M3 kernel) trained STEPS steps (default
# 300) of 4 × 512 tokens from the same initialisation and data order in bf16 and in FP8 on TOKENS (a `pith tokenize`
# output folder of real text, e.g. the King James Bible as scripts/demo.sh builds it), for each seed in SEEDS (default
# 1234): OUT/{bf16,fp8}-SEED/, and a second bf16 run of the first seed (OUT/bf16-SEED-again: how far two runs of one
# configuration part on the GPU, where cuDNN's attention backward adds with atomics in no fixed order). Writes
# OUT/loss.png (pith plot of the first seed's pair) and prints, per seed, the final losses (the mean of the last 20
# steps' training loss, and the validation loss after the last step on the first 16 batches of TOKENS) and their
# relative gaps, then each gap's mean over the seeds with its standard error, and the bf16 rerun's gaps
# (bench/pool_gaps.py pools the outputs of several calls with disjoint SEEDS).
# MODEL: a benchmark's folder (e.g. bench/qwen3_30b_a3b_8l) whose model and recipe to train instead, with TOKENS,
# STEPS and the validation set in place of its data and length. VARIANT, VNAME: the setting compared with bf16 and its
# name (default "fp8=true", fp8; e.g. "optimizer.state_dtype=bf16", bf16m). EXTRA: more --set arguments for every
# run ("--set benchmark=true": force-balanced routing, which keeps the two
# runs' routing histories together; "--set deterministic=true": runs that repeat bit for bit, so a gap is the
# variant's alone). JOBS: trainings run at once (default 1; the 101 M model leaves most of an H200 idle, and under
# deterministic the bits do not depend on what runs beside). PITH: the binary (default build/pith). Needs a GPU
# (DEVICE=cpu runs it on the CPU, to check the script).
set -euo pipefail
tokens=$(realpath "$1") out=$2 steps=${3:-300} device=${DEVICE:-cuda} pith=${PITH:-build/pith}
variant=${VARIANT:-fp8=true} vname=${VNAME:-fp8}
mkdir -p "$out"
if [ -n "${MODEL:-}" ]; then # a benchmark's model and recipe instead (its folder's model.json and train.json)
    cp "$MODEL/model.json" "$out/model.json"
    python3 - "$MODEL/train.json" "$out/train.json" "$tokens" "$steps" "$device" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(model="model.json", dataset=sys.argv[3], max_steps=int(sys.argv[4]), device=sys.argv[5],
         validation={"dataset": sys.argv[3], "batches": 16})
c.pop("run_dir", None)
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
else
    cp "$(dirname "$0")/qwen3_moe_101m/model.json" "$out/model.json"
    cat >"$out/train.json" <<JSON
{"model": "model.json", "dataset": "$tokens", "sequence_length": 512, "micro_batch_size": 4,
 "global_batch_size": 4, "max_steps": $steps, "seed": 1234, "init_std": 0.02,
 "optimizer": {"type": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
 "scheduler": {"type": "wsd", "warmup_ratio": 0.05, "decay_ratio": 0.2, "decay_shape": "cosine"},
 "clip_grad_norm": 1.0, "moe_load_balance_coef": 0.001, "device": "$device", "compute_dtype": "bf16",
 "validation": {"dataset": "$tokens", "batches": 16}}
JSON
fi
seeds=(${SEEDS:-1234})
runs=()
for seed in "${seeds[@]}"; do runs+=(bf16-$seed $vname-$seed); done
runs+=(bf16-${seeds[0]}-again)
for run in "${runs[@]}"; do # JOBS at a time, each leaving its exit status in OUT/rc_RUN
    set="--set seed=$(echo $run | cut -d- -f2)"
    [[ $run = $vname-* ]] && set="$set --set $variant"
    rm -rf "$out/$run" "$out/rc_$run"
    (
        rc=0
        $pith train "$out/train.json" --set run_dir="$out/$run" $set ${EXTRA:-} >"$out/train_$run.txt" 2>&1 || rc=$?
        echo $rc >"$out/rc_$run"
    ) &
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-1}" ]; do wait -n || true; done
done
wait
for run in "${runs[@]}"; do
    [ "$(cat "$out/rc_$run" 2>/dev/null)" = 0 ] ||
        { echo "run_fp8_loss.sh: $run failed (exit $(cat "$out/rc_$run" 2>/dev/null || echo none)):" >&2
          tail -3 "$out/train_$run.txt" >&2; exit 1; }
done
$pith plot "$out/bf16-${seeds[0]}" "$out/$vname-${seeds[0]}" --output "$out/loss.png"
python3 - "$out" "$vname" "${seeds[@]}" <<'PY'
import json, math, sys
out, vname, seeds = sys.argv[1], sys.argv[2], sys.argv[3:]
def rows(r): return [json.loads(l) for l in open(f'{out}/{r}/metrics.jsonl')]
def gap(a, b): return (a - b) / b * 100
def final(r): # the mean of the last 20 steps' training loss, the validation loss after the last step
    R = rows(r)
    return sum(x['loss'] for x in R[-20:]) / len(R[-20:]), R[-1]['val_loss'], len(R)
pairs = [(f'{vname}-{s}', f'bf16-{s}') for s in seeds] + [(f'bf16-{seeds[0]}-again', f'bf16-{seeds[0]}')]
G = []
for a, b in pairs:
    (ta, va, n), (tb, vb, _) = final(a), final(b)
    G.append((gap(ta, tb), gap(va, vb)))
    print(f"{a} vs {b}, {n} steps: last-20 train loss {ta:.4f} vs {tb:.4f} ({G[-1][0]:+.3f}%), validation {va:.4f} vs "
          f"{vb:.4f} ({G[-1][1]:+.3f}%)")
k = len(seeds)
for i, what in ((0, "last-20 train loss"), (1, "validation loss")):
    g = [x[i] for x in G[:k]]
    m = sum(g) / k
    se = math.sqrt(sum((x - m) ** 2 for x in g) / (k - 1) / k) if k > 1 else float('nan')
    print(f"{what}: {vname} against bf16 over {k} seed(s): mean gap {m:+.3f}% ± {se:.3f}% (standard error); "
          f"the bf16 rerun of seed {seeds[0]}: {G[-1][i]:+.3f}%")
PY
