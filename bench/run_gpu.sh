#!/usr/bin/env bash
# run_gpu.sh — the single-GPU benchmark in one call on the GPU machine, from the repository root:
#   1. end to end: `pith train` on bench/qwen3_30b_a3b_8l (Qwen3-30B-A3B shape cut to 8 layers, micro-batch
#      2 × 4096 tokens, bf16, natural routing, synthetic data), fwd+bwd tokens/s = median over steps ≥ 3;
#      the PyTorch peer (bench/peer_hf_qwen3_moe.py: HF transformers eager and torch.compile) in the same call;
#   2. kernels: build/bench_gpu_ops and its PyTorch counterparts (bench/peer_kernels.py);
#   3. the table (bench/report.py), printed last and kept in $OUT/table.md.
# Options: --no-peers (skip the HF model peers), --no-kernels, --no-e2e, --steps=N (default 8),
# --no-compile (kernel peers without the torch.compile'd ones), --deepseek-v2 (the end-to-end run and its peers on
# bench/deepseek_v2_lite_8l, DeepSeek-V2-Lite cut to 8 layers, with bench/peer_hf_deepseek_v2.py; the table's
# MFU column assumes Qwen3 shapes, so read that run's tokens/s and memory from train.txt and peers.txt),
# --gpt-oss (likewise on bench/gpt_oss_20b_4l, gpt-oss-20b cut to 4 layers, 2 sliding and 2 full, with
# bench/peer_hf_gpt_oss.py), --balanced (force-balanced routing: pith's benchmark mode and the peers' --balanced).
# --qwen3.5 (likewise on bench/qwen3_5_8l, Qwen3.5-35B-A3B's text shapes cut to 8 layers, 6 linear + 2 full, with
# bench/peer_hf_qwen3_5.py), --balanced (force-balanced routing: pith's benchmark mode and the peers' --balanced).
# Logs under $OUT (default /tmp/pith-bench): train.txt, peers.txt, bench_ops.txt, peer_kernels.txt, table.md.
# Binaries: built here when the build libraries exist, else the carried build/ (see tests/gpu/run_device.sh).
set -u
OUT=${OUT:-/tmp/pith-bench}
mkdir -p "$OUT"
peers=1 kernels=1 e2e=1 steps=8 pk="" bench=bench/qwen3_30b_a3b_8l peer=bench/peer_hf_qwen3_moe.py vocab=151936 bal="" pbal=""
for a in "$@"; do
    case "$a" in --no-peers) peers=0 ;; --no-kernels) kernels=0 ;; --no-e2e) e2e=0 ;; --steps=*) steps=${a#--steps=} ;; --no-compile) pk=--no-compile ;;
    --deepseek-v2) bench=bench/deepseek_v2_lite_8l peer=bench/peer_hf_deepseek_v2.py vocab=102400 ;;
    --gpt-oss) bench=bench/gpt_oss_20b_4l peer=bench/peer_hf_gpt_oss.py vocab=201088 ;;
    --qwen3.5) bench=bench/qwen3_5_8l peer=bench/peer_hf_qwen3_5.py vocab=248320 ;;
    --balanced) bal="--set benchmark=true" pbal=--balanced ;; esac
done
if [ -d lib ]; then
    mkdir -p /tmp/pithlib
    for f in lib/*; do case "$f" in *.gz) gunzip -c "$f" >"/tmp/pithlib/$(basename "$f" .gz)" ;; *) cp "$f" /tmp/pithlib/ ;; esac; done
    export LD_LIBRARY_PATH=/tmp/pithlib:${LD_LIBRARY_PATH:-}
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
if [ ! -x build/pith ] || [ ! -x build/bench_gpu_ops ]; then
    make -j16 build/pith build/bench_gpu_ops >"$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
date -u +"%Y-%m-%d %H:%M UTC"
if [ $e2e = 1 ]; then
    echo "== pith train (${steps} steps)"
    mkdir -p /tmp/pith-bench-data
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab $vocab --tokens 200000 --seed 1 >/dev/null
    rm -rf /tmp/pith-bench-run
    timeout 420 build/pith train $bench/train.json --set max_steps="$steps" $bal >"$OUT/train.txt" 2>&1
    echo "rc=$?" >>"$OUT/train.txt"
    cat /tmp/pith-bench-run/metrics.jsonl >>"$OUT/train.txt" 2>/dev/null
    grep -v '^{' "$OUT/train.txt" | tail -4
fi
if [ $kernels = 1 ]; then
    echo "== kernels"
    timeout 180 build/bench_gpu_ops >"$OUT/bench_ops.txt" 2>&1
    echo "rc=$?" >>"$OUT/bench_ops.txt"
    timeout 300 python3 bench/peer_kernels.py $pk >"$OUT/peer_kernels.txt" 2>&1
    echo "rc=$?" >>"$OUT/peer_kernels.txt"
fi
if [ $peers = 1 ]; then
    echo "== HF peers"
    : >"$OUT/peers.txt"
    timeout 300 python3 $peer $pbal >>"$OUT/peers.txt" 2>&1
    timeout 420 python3 $peer --compile $pbal >>"$OUT/peers.txt" 2>&1
    grep '^{' "$OUT/peers.txt"
fi
python3 bench/report.py "$OUT" >"$OUT/table.md"
cat "$OUT/table.md"
