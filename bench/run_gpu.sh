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
# --both (pith natural into train.txt and force-balanced into train_balanced.txt, side by side in the table; the
# peers as given, --balanced to force theirs).
# --schedule (the DualPipeV engine at pp = 1 beside the plain step, same lease: the end-to-end run twice with 2
# micro-batches per step, global_batch_size=4 — plain, then parallel.pipeline_schedule=true, the layers in two
# chunks on the one GPU — into train_plain.txt and train_schedule.txt, their fwd+bwd medians and peaks compared;
# nothing else runs).
# Logs under $OUT (default /tmp/pith-bench): train.txt, peers.txt, bench_ops.txt, peer_kernels.txt, table.md.
# Binaries: built here when the build libraries exist, else the carried build/ (see tests/gpu/run_device.sh).
set -u
OUT=${OUT:-/tmp/pith-bench}
mkdir -p "$OUT"
peers=1 kernels=1 e2e=1 steps=8 pk="" bench=bench/qwen3_30b_a3b_8l peer=bench/peer_hf_qwen3_moe.py vocab=151936 bal="" pbal=""
schedule=0 both=0
for a in "$@"; do
    case "$a" in --no-peers) peers=0 ;; --no-kernels) kernels=0 ;; --no-e2e) e2e=0 ;; --steps=*) steps=${a#--steps=} ;; --no-compile) pk=--no-compile ;;
    --deepseek-v2) bench=bench/deepseek_v2_lite_8l peer=bench/peer_hf_deepseek_v2.py vocab=102400 ;;
    --gpt-oss) bench=bench/gpt_oss_20b_4l peer=bench/peer_hf_gpt_oss.py vocab=201088 ;;
    --qwen3.5) bench=bench/qwen3_5_8l peer=bench/peer_hf_qwen3_5.py vocab=248320 ;;
    --balanced) bal="--set benchmark=true" pbal=--balanced ;;
    --both) both=1 ;;
    --schedule) schedule=1 ;; esac
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
    make -j16 GPU=1 build/pith build/bench_gpu_ops >"$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; exit 1; }
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader
date -u +"%Y-%m-%d %H:%M UTC"
if [ $schedule = 1 ]; then # the engine at pp = 1 against the plain step: fwd+bwd median over steps >= 3
    mkdir -p /tmp/pith-bench-data
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab $vocab --tokens 200000 --seed 1 >/dev/null
    for mode in plain schedule; do
        sets="--set max_steps=$steps --set global_batch_size=4"
        [ $mode = schedule ] && sets="$sets --set parallel.pipeline_schedule=true"
        echo "== pith train, $mode (${steps} steps, 2 micro-batches of 2 × 4096 tokens per step)"
        rm -rf /tmp/pith-bench-run
        timeout 420 build/pith train $bench/train.json $sets $bal >"$OUT/train_$mode.txt" 2>&1
        echo "rc=$?" >>"$OUT/train_$mode.txt"
        cat /tmp/pith-bench-run/metrics.jsonl >>"$OUT/train_$mode.txt" 2>/dev/null
        grep -v '^{' "$OUT/train_$mode.txt" | tail -3
    done
    python3 - "$OUT" <<'PY' | tee "$OUT/table.md"
import json, re, statistics, sys
row = {}
for mode in ("plain", "schedule"):
    recs = [json.loads(x) for x in re.findall(r'^\{"step".*\}$', open(f"{sys.argv[1]}/train_{mode}.txt").read(), re.M)]
    late = [r for r in recs if r["step"] >= 3] or recs
    if not recs:
        print(f"{mode}: no steps (see train_{mode}.txt)"); continue
    fb = statistics.median(r["fwdbwd_s"] for r in late)
    row[mode] = fb
    print(f"| {mode} | {4 * 4096 / fb:.0f} tokens/s | fwd+bwd {fb:.3f} s | GPU peak {max(r['gpu_peak_gb'] for r in recs):.1f} GB"
          f" | loss at step {recs[-1]['step']} {recs[-1]['loss']:.6f} |")
if len(row) == 2:
    print(f"schedule / plain fwd+bwd time: {row['schedule'] / row['plain']:.3f}")
PY
    exit 0
fi
if [ $e2e = 1 ]; then
    echo "== pith train (${steps} steps)"
    mkdir -p /tmp/pith-bench-data
    build/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab $vocab --tokens 200000 --seed 1 >/dev/null
    rm -rf /tmp/pith-bench-run
    timeout 420 build/pith train $bench/train.json --set max_steps="$steps" $bal >"$OUT/train.txt" 2>&1
    echo "rc=$?" >>"$OUT/train.txt"
    cat /tmp/pith-bench-run/metrics.jsonl >>"$OUT/train.txt" 2>/dev/null
    grep -v '^{' "$OUT/train.txt" | tail -4
    if [ $both = 1 ]; then
        echo "== pith train, force-balanced (${steps} steps)"
        rm -rf /tmp/pith-bench-run
        timeout 420 build/pith train $bench/train.json --set max_steps="$steps" --set benchmark=true \
            >"$OUT/train_balanced.txt" 2>&1
        echo "rc=$?" >>"$OUT/train_balanced.txt"
        cat /tmp/pith-bench-run/metrics.jsonl >>"$OUT/train_balanced.txt" 2>/dev/null
        grep -v '^{' "$OUT/train_balanced.txt" | tail -4
    fi
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
