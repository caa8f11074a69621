#!/usr/bin/env bash
# run_fp8_loss.sh TOKENS OUT [STEPS] — issue 22's loss comparison: the demo's Qwen3-MoE scaled up (hidden 512, 4
# layers, 16 experts top-2 of width 256, layer 0 a dense MLP of 1024 so both FP8 paths train: the dense GEMMs on the
# FP8 tensor cores, the experts on rounded operands) trained STEPS steps (default 300) of 4 × 512 tokens from the same
# initialisation and data order in bf16 and in FP8 on TOKENS (a `pith tokenize` output folder of real text, e.g. the
# King James Bible as scripts/demo.sh builds it). Writes OUT/{bf16,fp8}/metrics.jsonl, OUT/loss.png (pith plot, both
# curves) and prints the final losses (the mean of the last 20 steps, and the last step's) with their relative gap.
# EXTRA: more --set arguments for both runs ("--set benchmark=true": force-balanced routing, which keeps the two
# runs' routing histories together). Needs build/pith and a GPU (DEVICE=cpu runs it on the CPU, to check the script).
set -euo pipefail
tokens=$(realpath "$1") out=$2 steps=${3:-300} device=${DEVICE:-cuda}
mkdir -p "$out"
cat >"$out/model.json" <<'JSON'
{"model_type": "qwen3_moe", "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
 "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-6,
 "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "vocab_size": 151936,
 "num_experts": 16, "num_experts_per_tok": 2, "moe_intermediate_size": 256, "intermediate_size": 1024,
 "norm_topk_prob": true, "attention_bias": false, "tie_word_embeddings": true, "decoder_sparse_step": 1,
 "mlp_only_layers": [0]}
JSON
cat >"$out/train.json" <<JSON
{"model": "model.json", "dataset": "$tokens", "sequence_length": 512, "micro_batch_size": 4,
 "global_batch_size": 4, "max_steps": $steps, "seed": 1234, "init_std": 0.02,
 "optimizer": {"type": "adamw", "lr": 3e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
 "scheduler": {"type": "wsd", "warmup_ratio": 0.05, "decay_ratio": 0.2, "decay_shape": "cosine"},
 "clip_grad_norm": 1.0, "moe_load_balance_coef": 0.001, "device": "$device", "compute_dtype": "bf16"}
JSON
for run in bf16 fp8; do
    set=""
    [ $run = fp8 ] && set="--set fp8=true"
    rm -rf "$out/$run"
    build/pith train "$out/train.json" --set run_dir="$out/$run" $set ${EXTRA:-} >"$out/train_$run.txt" 2>&1
done
build/pith plot "$out/bf16" "$out/fp8" --output "$out/loss.png"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
L = {r: [json.loads(l)['loss'] for l in open(f'{out}/{r}/metrics.jsonl')] for r in ('bf16', 'fp8')}
m = {r: sum(v[-20:]) / len(v[-20:]) for r, v in L.items()}
print(f"steps {len(L['bf16'])}: loss bf16 {L['bf16'][0]:.4f} -> {L['bf16'][-1]:.4f}, fp8 {L['fp8'][0]:.4f} -> "
      f"{L['fp8'][-1]:.4f}; mean of the last 20: bf16 {m['bf16']:.4f}, fp8 {m['fp8']:.4f}, "
      f"gap {(m['fp8'] - m['bf16']) / m['bf16'] * 100:+.3f}% (last step {(L['fp8'][-1] - L['bf16'][-1]) / L['bf16'][-1] * 100:+.3f}%)")
PY
