#!/usr/bin/env bash
# run.sh — the supervised fine-tuning example end to end, on the CPU: a base model (a short run on synthetic tokens,
# converted to an HF folder), the prompt/completion pairs tokenized with their prompts masked, the fine-tuning run
# from the HF folder (init_from), and the per-token losses of the result. Run from the repository root after `make`.
# PITH overrides the binary; arguments go to the fine-tuning run (`--set max_steps=60`); the outputs go to data/sft/
# and runs/sft-base/, runs/sft/ (removed first).
set -euo pipefail
cd "$(dirname "$0")/../.."
pith=${PITH:-build/pith}
rm -rf data/sft runs/sft-base runs/sft
mkdir -p data/sft
"$pith" synth --output data/sft/base.bin --vocab 257 --tokens 40000 --eos 256
"$pith" train examples/sft/base.json
"$pith" convert pith2hf runs/sft-base data/sft/base-hf --tokenizer examples/sft/tokenizer.json
"$pith" tokenize --tokenizer examples/sft/tokenizer.json --format prompt-completion \
    --input examples/sft/pairs.jsonl --output data/sft/tokens --workers 1
"$pith" train examples/sft/train.json "$@"
"$pith" eval --model runs/sft --data data/sft/tokens --seq 64 --batch 8 --per-token data/sft/per_token.npy
