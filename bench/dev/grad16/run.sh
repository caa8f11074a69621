#!/usr/bin/env bash
# bench/dev/grad16/run.sh — `gradient_dtype: bf16` (bf16 expert gradient accumulators) on one H200, ≈ 230 s. Staged
# for bench/session.sh's helper mode: copy this folder to .dev-grad16 and run `bash bench/session.sh h:grad16:290`
# (the candidate's pith, build-cand/pith, else build/pith; PITH overrides). Writes into $OUT:
# 1. bench/qwen3_30b_a3b_8l (8 layers of Qwen3-30B-A3B, micro-batches of 2 × 4096 tokens, force-balanced routing),
#    8 steps each with fp32 and with bf16 expert gradients, at one micro-batch a step (global batch 2: each gradient
#    written once) and at two (global batch 4: the second adds to the first): the medians over steps 3–8 of fwd+bwd,
#    the optimizer and the step, and the GPU peak (train_*.txt, metrics_*.jsonl, summary lines on stdout).
# 2. The loss: bench/run_fp8_loss.sh's 101 M Qwen3-MoE on .gpu/kjv/tokens, 300 steps of 4 micro-batches of 1 × 512
#    tokens (every step adds 4 micro-batches into each gradient), deterministic, force-balanced, for each of SEEDS
#    (default 1 2 3 4): fp32 gradients (the runs named bf16-SEED: bf16 compute) against bf16 expert gradients
#    (bf16g-SEED), and a rerun of the first seed (loss/, loss.txt: the mean gaps with their standard errors).
set -u
pith=${PITH:-build-cand/pith}
[ -x "$pith" ] || pith=build/pith
out=${OUT:-/tmp/h/grad16}
mkdir -p "$out" /tmp/pith-bench-data
$pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
for gb in 2 4; do
    for dt in fp32 bf16; do
        n=gb$gb-$dt
        rm -rf /tmp/pith-bench-run
        timeout 50 $pith train bench/qwen3_30b_a3b_8l/train.json --set benchmark=true --set max_steps=8 \
            --set global_batch_size=$gb --set gradient_dtype=$dt >"$out/train_$n.txt" 2>&1
        echo "rc=$?" >>"$out/train_$n.txt"
        cp /tmp/pith-bench-run/metrics.jsonl "$out/metrics_$n.jsonl" 2>/dev/null
        python3 - "$n" "$out/metrics_$n.jsonl" $((gb * 4096)) <<'PY' 2>&1 | tail -1
import json, statistics, sys
R = [json.loads(l) for l in open(sys.argv[2])]
S = R[2:]; fb = statistics.median(r['fwdbwd_s'] for r in S); st = statistics.median(r['step_time_s'] for r in S)
peak = max((r.get('gpu_peak_gb') or 0) for r in R)
print(f"{sys.argv[1]}: fwd+bwd {fb*1e3:.1f} ms = {int(sys.argv[3])/fb:,.0f} tokens/s; optimizer {(st-fb)*1e3:.1f} ms; "
      f"step {st*1e3:.1f} ms; GPU peak {peak:.1f} GB; loss {R[0]['loss']:.3f} -> {R[-1]['loss']:.3f}")
PY
        grep -h "^plan (" "$out/train_$n.txt" | head -1
    done
done
SEEDS=${SEEDS:-1 2 3 4} VARIANT=gradient_dtype=bf16 VNAME=bf16g PITH=$pith \
    EXTRA="--set benchmark=true --set deterministic=true --set micro_batch_size=1" \
    timeout 170 bash bench/run_fp8_loss.sh .gpu/kjv/tokens "$out/loss" >"$out/loss.txt" 2>&1
echo "loss: rc=$?"
tail -8 "$out/loss.txt"
