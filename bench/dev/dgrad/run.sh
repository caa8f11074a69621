#!/usr/bin/env bash
# bench/dev/dgrad/run.sh — `parallel.gradient_reduce: layer` against `step` on real NCCL with two ranks sharing one
# H200. PARTS (default "sanity exact loss mem") picks the parts; one layer run of part 2 takes ≈ 140 s over sockets,
# so a 600 s call holds part 1 and one seed, or two seeds. Each rank is its own NCCL "host" (NCCL_HOSTID), so NCCL
# accepts two ranks on one GPU and joins them by its network transport over the loopback interface;
# CUDA_VISIBLE_DEVICES=0 lets pith put both on GPU 0. NCCL_SOCKET_NTHREADS × NCCL_NSOCKS_PERTHREAD sockets (default
# 4 × 4) carry each transfer; with two ranks every reduced element is one addition, so the numbers do not depend on
# them. Runs go one at a time: four pairs sharing the GPU by time slices took 6 s a step instead of 0.47 (NCCL's
# kernels spin on the GPU while they wait for the sockets). Staged for bench/session.sh's helper mode: copy this
# folder to .dev-dgrad, `bash bench/session.sh h:dgrad:560`. Writes to $OUT (summary.txt, logs, metrics.jsonl):
# 1. exact: bench/qwen3_moe_101m's Qwen3-MoE (bench/run_fp8_loss.sh's) on .gpu/kjv/tokens, dp 2, one micro-batch of
#    1 × 512 a rank, 300 steps, deterministic, force-balanced: step against layer — every step's loss and the
#    validation loss equal.
# 2. loss: the same with four micro-batches a rank (global batch 8), seeds SEEDS (default 1 2 3): the final losses'
#    relative gaps (layer − step), their mean and standard error.
# 3. mem: bench/qwen3_30b_a3b_8l at ep 2 (64 experts a rank, 1 × 4096 tokens a rank, balanced), 8 steps, step
#    against layer: rank 0's plan and GPU peak, the step times (two processes share the GPU's SMs and talk over
#    sockets: the times are the pair's, not one GPU's).
set -u
pith=$(realpath "${PITH:-build/pith}")
out=${OUT:-/tmp/h/dgrad}
mkdir -p "$out"
two() { # two NAME SECONDS ARGS...: `pith train ARGS` on two ranks sharing GPU 0
    local n=$1 t=$2
    shift 2
    timeout "$t" mpirun -np 2 --bind-to none -x OMP_NUM_THREADS=4 -x LD_LIBRARY_PATH -x PATH -x CUDA_VISIBLE_DEVICES=0 \
        -x NCCL_SOCKET_IFNAME=lo -x NCCL_IB_DISABLE=1 -x NCCL_NVLS_ENABLE=0 \
        -x NCCL_SOCKET_NTHREADS=${NCCL_SOCKET_NTHREADS:-4} -x NCCL_NSOCKS_PERTHREAD=${NCCL_NSOCKS_PERTHREAD:-4} \
        bash -c 'NCCL_HOSTID=pith-rank-$OMPI_COMM_WORLD_RANK exec "$0" train "$@"' "$pith" "$@" >"$out/$n.txt" 2>&1
    echo "$n: rc=$? $(grep '^step ' "$out/$n.txt" | tail -1 | cut -c1-200)" | tee -a "$out/summary.txt"
}
m=$out/m101
mkdir -p "$m"
cp bench/qwen3_moe_101m/model.json "$m/model.json"
tok=$(realpath .gpu/kjv/tokens)
cat >"$m/train.json" <<JSON
{"model": "model.json", "dataset": "$tok", "sequence_length": 512, "micro_batch_size": 1,
 "global_batch_size": 2, "max_steps": 300, "seed": 1, "init_std": 0.02,
 "optimizer": {"type": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
 "scheduler": {"type": "wsd", "warmup_ratio": 0.05, "decay_ratio": 0.2, "decay_shape": "cosine"},
 "clip_grad_norm": 1.0, "moe_load_balance_coef": 0.001, "device": "cuda", "compute_dtype": "bf16",
 "benchmark": true, "deterministic": true, "validation": {"dataset": "$tok", "batches": 16}}
JSON
parts=" ${PARTS:-sanity exact loss mem} "
[[ $parts = *" sanity "* ]] && two sanity 60 "$m/train.json" --set max_steps=3 --set parallel.gradient_reduce=layer \
    --set run_dir=$out/r-sanity
[[ $parts = *" exact "* ]] && for gr in step layer; do two exact-$gr 75 "$m/train.json" --set parallel.gradient_reduce=$gr --set run_dir=$out/r-exact-$gr; done
[[ $parts = *" loss "* ]] && for s in ${SEEDS:-1 2 3}; do
    for gr in step layer; do
        two loss-$gr-$s "${LOSS_T:-170}" "$m/train.json" --set global_batch_size=8 --set seed=$s \
            --set parallel.gradient_reduce=$gr --set run_dir=$out/r-loss-$gr-$s
    done
done
mkdir -p /tmp/pith-bench-data
$pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
[[ $parts = *" mem "* ]] && for gr in step layer; do
    two mem-$gr 100 bench/qwen3_30b_a3b_8l/train.json --set max_steps=8 --set micro_batch_size=1 --set benchmark=true \
        --set parallel.expert_parallel_size=2 --set parallel.gradient_reduce=$gr --set run_dir=$out/r-mem-$gr
done
python3 - "$out" <<'PY' 2>&1 | tee -a "$out/summary.txt"
import json, math, statistics, sys, os
o = sys.argv[1]
def rows(n):
    p = f"{o}/r-{n}/metrics.jsonl"
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
a, b = rows("exact-step"), rows("exact-layer")
if a and b:
    same = sum(x["loss"] == y["loss"] for x, y in zip(a, b))
    va, vb = [x.get("val_loss") for x in a if "val_loss" in x], [x.get("val_loss") for x in b if "val_loss" in x]
    print(f"exact: {same} of {len(a)}/{len(b)} steps' losses equal; validation {va[-1:]} vs {vb[-1:]}; "
          f"final {a[-1]['loss']!r} vs {b[-1]['loss']!r}")
gt, gv = [], []
for s in os.environ.get("SEEDS", "1 2 3").split():
    A, B = rows(f"loss-step-{s}"), rows(f"loss-layer-{s}")
    if len(A) < 300 or len(B) < 300: print(f"seed {s}: incomplete ({len(A)}, {len(B)} steps)"); continue
    ta, tb = statistics.mean(r["loss"] for r in A[-20:]), statistics.mean(r["loss"] for r in B[-20:])
    va, vb = A[-1]["val_loss"], B[-1]["val_loss"]
    gt.append((tb - ta) / ta * 100), gv.append((vb - va) / va * 100)
    print(f"seed {s}: train {ta:.5f} step, {tb:.5f} layer ({gt[-1]:+.4f}%); val {va:.5f}, {vb:.5f} ({gv[-1]:+.4f}%)")
for name, g in (("train", gt), ("val", gv)):
    if len(g) > 1:
        print(f"{name} gap layer - step: {statistics.mean(g):+.4f}% ± {statistics.stdev(g) / math.sqrt(len(g)):.4f}% (s.e., {len(g)} seeds)")
for gr in ("step", "layer"):
    R = rows(f"mem-{gr}")
    if len(R) >= 3:
        S = R[2:]
        print(f"mem-{gr}: step {statistics.median(r['step_time_s'] for r in S)*1e3:.0f} ms, fwd+bwd "
              f"{statistics.median(r['fwdbwd_s'] for r in S)*1e3:.0f} ms (two ranks on one GPU, sockets); rank 0 GPU peak "
              f"{max(r['gpu_peak_gb'] for r in R):.3f} GB")
PY
grep -h "gpu-peak-mem" "$out"/mem-*.txt | sed 's/.*gpu-peak/gpu-peak/' | tail -2 | tee -a "$out/summary.txt"
