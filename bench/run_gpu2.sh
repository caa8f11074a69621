#!/usr/bin/env bash
# run_gpu2.sh — the two-GPU benchmarks, from the repository root of a machine with two GPUs and the built
# binaries (build/pith, build/bench_ep; tests/gpu/run_device2.sh provides them on the device):
#   1. EP dispatch + combine (build/bench_ep: bf16 rows of 2048, top-8 of 128 experts, random routing,
#      T tokens per rank) against torch.distributed.all_to_all_single (bench/peer_a2a.py under torchrun) at
#      the same per-peer row counts; logical GB/s per GPU = rows each GPU sends (itself included) × 2048 × 2 B
#      over the time, the ranks' mean bytes over the slowest rank's time, a device sync after each call.
#   2. bench/qwen3_30b_a3b_8l (the single-GPU end-to-end benchmark of bench/run_gpu.sh: Qwen3-30B-A3B cut to
#      8 layers, micro-batch 2 x 4096, natural routing) at ep2, one micro-batch per GPU and step: tokens/s per
#      GPU over forward+backward (as bench/report.py counts it) and over the whole step, medians of steps 3..
#   3. with --fsdp: the same model at ep 1 over two FSDP ranks (dp 2, parameters sharded), one micro-batch per GPU.
#   4. with --pp2: the same model at pipeline_parallel_size 2 (DualPipeV, 4 layers per GPU in two chunks),
#      global batch 16 and 32 = 8 and 16 micro-batches of 2 x 4096 through the pipeline: tokens/s per GPU
#      and the bubble the trainer measures (metrics.jsonl: bubble, pipe_busy_s).
# Options: --quick (T = 4096 only, 4 steps), --baseline (also the same model on one GPU, ep 1), --fsdp, --pp2.
# Environment (bench/run_x2.sh --dry sets them to try the script on fake GPUs): PITH_BUILD (binaries, default
# build), PITH_MPI (the two-rank launcher), PITH_Q8 (the model's folder), PITH_Q8_VOCAB, PITH_Q8_SETS (more --set options), PITH_EP_TOKENS,
# PITH_RUNS (a file each train run is appended to as NAME<tab>GPUS<tab>RUN_DIR<tab>ARGS, for bench/run_x2.sh's
# memory check). Without torch the peer step prints "skipped (no torch)".
# Work files under /tmp/pith-gpu2; copied to $OUT (at most 8 files come back from the device): the two
# .jsonl results, the 8-layer run's log and each run's metrics. A table last.
set -u
OUT=${OUT:-/tmp/pith-out}
W=/tmp/pith-gpu2
mkdir -p "$W/splits" "$OUT"
rm -f "$W"/splits/*.json
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
B=${PITH_BUILD:-build}
MPI=${PITH_MPI:-mpirun --bind-to none -np 2}
Q8=${PITH_Q8:-bench/qwen3_30b_a3b_8l}
# Each step's time limit keeps the whole script inside PITH_DEADLINE (epoch seconds; default 9 minutes
# from now), so the table at the end always prints.
deadline=${PITH_DEADLINE:-$(($(date +%s) + 540))}
limit() { local l=$((deadline - $(date +%s) - 20)); ((l > $1)) && l=$1; ((l < 5)) && l=5; echo $l; }
tokens=${PITH_EP_TOKENS:-1024,4096,16384} steps=8 baseline=0 pp2=0 fsdp=0
for a in "$@"; do case "$a" in --quick) tokens=${PITH_EP_TOKENS:-4096} steps=4 ;; --baseline) baseline=1 ;; --fsdp) fsdp=1 ;; --pp2) pp2=1 ;; esac; done

echo "== pith dispatch + combine ($B/bench_ep, T = $tokens per rank)"
timeout $(limit 150) $MPI $B/bench_ep --tokens $tokens --iters 20 --splits "$W/splits" 2>&1 | tee "$W/bench_ep.log"
grep '^{' "$W/bench_ep.log" >"$W/bench_ep.jsonl"

echo "== torch.distributed.all_to_all_single at the same row counts"
if python3 -c "import torch" 2>/dev/null; then
    PYTHONUNBUFFERED=1 timeout $(limit 150) python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/peer_a2a.py "$W/splits" --iters 20 2>&1 |
        tee "$W/peer_a2a.log"
else echo "skipped (no torch)" | tee "$W/peer_a2a.log"; fi
grep '^{' "$W/peer_a2a.log" >"$W/peer_a2a.jsonl"

# train NAME GPUS LIMIT_S ARGS...: one run of the model into $W/NAME (log $W/NAME.log), recorded in PITH_RUNS.
train() {
    local name=$1 gpus=$2 lim=$3 launch="" t0
    shift 3
    ((gpus > 1)) && launch=$MPI
    rm -rf "${W:?}/$name"
    [ -n "${PITH_RUNS:-}" ] && printf '%s\t%s\t%s\t%s\n' "$name" "$gpus" "$W/$name" "$q8 $*" >>"$PITH_RUNS"
    t0=$(date +%s)
    timeout $(limit $lim) $launch $B/pith train $q8 "$@" --set run_dir="$W/$name" >"$W/$name.log" 2>&1
    echo "rc=$? ($(($(date +%s) - t0)) s)"
    grep -E "^(mesh|plan|step|done)|error" "$W/$name.log"
    cp "$W/$name/metrics.jsonl" "$OUT/$name-metrics.jsonl" 2>/dev/null
}
[ -s "$W/q8data.bin" ] || $B/pith synth --output "$W/q8data.bin" --vocab ${PITH_Q8_VOCAB:-151936} --tokens 200000 >/dev/null
q8="$Q8/train.json --set dataset=$W/q8data.bin --set max_steps=$steps --set parallel.timeout_s=300 ${PITH_Q8_SETS:-}"
echo "== Qwen3-30B-A3B, 8 layers, ep2 ($Q8: one micro-batch per rank)"
train q8-ep2 2 300 --set parallel.expert_parallel_size=2 --set global_batch_size=4
if [ $baseline = 1 ]; then
    echo "== the same on one GPU (ep 1)"
    train q8-ep1 1 300 --set global_batch_size=2
fi
if [ $fsdp = 1 ]; then
    echo "== the same at ep 1 over two FSDP ranks (dp 2, every parameter sharded)"
    train q8-fsdp2 2 300 --set parallel.sharding_strategy=fsdp --set global_batch_size=4
fi
if [ $pp2 = 1 ]; then
    for n in 8 16; do
        echo "== the same at pp 2 (DualPipeV, $n micro-batches through the pipeline)"
        train q8-pp2-n$n 2 300 --set parallel.pipeline_parallel_size=2 --set global_batch_size=$((2 * n))
    done
fi
cp "$W/bench_ep.jsonl" "$W/peer_a2a.jsonl" "$W/q8-ep2.log" "$OUT/" 2>/dev/null
python3 - "$W" <<'EOF'
import json, os, statistics, sys
W = sys.argv[1]
def lines(p):
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
pith = {r["T"]: r for r in lines(f"{W}/bench_ep.jsonl")}
torch = {r["T"]: r for r in lines(f"{W}/peer_a2a.jsonl")}
print()
print("EP dispatch + combine on 2 GPUs: bf16 rows of 2048, top-8 of 128 experts, random routing; logical GB/s per GPU")
print(f"{'T/rank':>7} {'MB d+c':>8} | {'pith full ms':>12} {'GB/s':>6} | {'pith a2a ms':>11} {'GB/s':>6} | {'torch a2a ms':>12} {'GB/s':>6} | {'a2a pith/torch':>14}")
for T in sorted(set(pith) | set(torch)):
    p, t = pith.get(T, {}), torch.get(T, {})
    mb = p.get("dispatch_mb", t.get("dispatch_mb", 0)) + p.get("combine_mb", t.get("combine_mb", 0))
    fm = p.get("full_dispatch_ms", 0) + p.get("full_combine_ms", 0)
    pm = p.get("payload_dispatch_ms", 0) + p.get("payload_combine_ms", 0)
    tm = t.get("payload_dispatch_ms", 0) + t.get("payload_combine_ms", 0)
    ratio = f"{p['payload_gbps'] / t['payload_gbps']:.2f}x" if p and t and t["payload_gbps"] else "-"
    print(f"{T:>7} {mb:>8.1f} | {fm:>12.3f} {p.get('full_gbps', 0):>6.1f} | {pm:>11.3f} {p.get('payload_gbps', 0):>6.1f} | {tm:>12.3f} {t.get('payload_gbps', 0):>6.1f} | {ratio:>14}")
if torch:
    r = next(iter(torch.values()))
    print(f"(torch {r.get('torch')}, NCCL {r.get('nccl')}; 'full' = pith's dispatch + combine with routing, counts and permutations)")
runs = (("q8-ep1", 1, "one GPU"), ("q8-ep2", 2, "ep 2 on 2 GPUs"), ("q8-fsdp2", 2, "ep 1, FSDP over 2 GPUs"),
        ("q8-pp2-n8", 2, "pp 2 on 2 GPUs, 8 micro-batches"), ("q8-pp2-n16", 2, "pp 2 on 2 GPUs, 16 micro-batches"))
print(f"\nThe 8-layer model per GPU (medians of steps 3..; tokens per step from tokens/s × step time)")
print(f"{'run':>11} | {'layout':<34} | {'tok/s/GPU f+b':>13} {'with optim':>10} | {'bubble':>6} | {'GPU peak GB':>11} | loss")
for name, gpus, what in runs:
    m = lines(f"{W}/{name}/metrics.jsonl")
    if not m:
        if os.path.exists(f"{W}/{name}.log"): print(f"{name:>11} | {what:<34} | no steps (see {W}/{name}.log)")
        continue
    late = [s for s in m if s["step"] >= 3] or m  # as bench/report.py: steps 3.. (the first ones warm up)
    tokens = m[-1]["tokens_per_s"] * m[-1]["step_time_s"] / gpus  # per GPU and step
    fb = statistics.median(s["fwdbwd_s"] for s in late)
    st = statistics.median(s["step_time_s"] for s in late)
    bub = f"{statistics.median(s['bubble'] for s in late):.3f}" if "bubble" in m[-1] else "-"
    print(f"{name:>11} | {what:<34} | {tokens / fb:>13,.0f} {tokens / st:>10,.0f} | {bub:>6} | "
          f"{max(s['gpu_peak_gb'] for s in m):>11.3f} | {m[0]['loss']:.3f} -> {m[-1]['loss']:.3f}")
EOF
