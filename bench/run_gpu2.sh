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
#   3. with --pp2: the same model at pipeline_parallel_size 2 (DualPipeV, 4 layers per GPU in two chunks),
#      global batch 8 = 4 micro-batches of 2 x 4096 through the pipeline (N = 2P): tokens/s per GPU.
# Options: --quick (T = 4096 only, 4 steps), --baseline (also the same model on one GPU, ep 1), --pp2.
# Work files under /tmp/pith-gpu2; copied to $OUT (at most 8 files come back from the device): the two
# .jsonl results, the 8-layer run's log and metrics. A table last.
set -u
OUT=${OUT:-/tmp/pith-out}
W=/tmp/pith-gpu2
mkdir -p "$W/splits" "$OUT"
rm -f "$W"/splits/*.json
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI="mpirun --bind-to none -np 2"
# Each step's time limit keeps the whole script inside PITH_DEADLINE (epoch seconds; default 9 minutes
# from now), so the table at the end always prints.
deadline=${PITH_DEADLINE:-$(($(date +%s) + 540))}
limit() { local l=$((deadline - $(date +%s) - 20)); ((l > $1)) && l=$1; ((l < 5)) && l=5; echo $l; }
tokens=1024,4096,16384 steps=8 baseline=0 pp2=0
for a in "$@"; do case "$a" in --quick) tokens=4096 steps=4 ;; --baseline) baseline=1 ;; --pp2) pp2=1 ;; esac; done

echo "== pith dispatch + combine (build/bench_ep, T = $tokens per rank)"
timeout $(limit 150) $MPI build/bench_ep --tokens $tokens --iters 20 --splits "$W/splits" 2>&1 | tee "$W/bench_ep.log"
grep '^{' "$W/bench_ep.log" >"$W/bench_ep.jsonl"

echo "== torch.distributed.all_to_all_single at the same row counts"
PYTHONUNBUFFERED=1 timeout $(limit 150) python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/peer_a2a.py "$W/splits" --iters 20 2>&1 |
    tee "$W/peer_a2a.log"
grep '^{' "$W/peer_a2a.log" >"$W/peer_a2a.jsonl"

echo "== Qwen3-30B-A3B, 8 layers, ep2 (bench/qwen3_30b_a3b_8l: micro-batch 2 x 4096 per rank)"
[ -s "$W/q8data.bin" ] || build/pith synth --output "$W/q8data.bin" --vocab 151936 --tokens 200000 >/dev/null
q8="bench/qwen3_30b_a3b_8l/train.json --set dataset=$W/q8data.bin --set max_steps=$steps --set parallel.timeout_s=300"
t0=$(date +%s)
timeout $(limit 300) $MPI build/pith train $q8 --set parallel.expert_parallel_size=2 --set global_batch_size=4 --set run_dir="$W/q8-ep2" \
    >"$W/q8-ep2.log" 2>&1
echo "rc=$? ($(($(date +%s) - t0)) s)"
grep -E "^(mesh|plan|step|done)|error" "$W/q8-ep2.log"
if [ $baseline = 1 ]; then
    echo "== the same on one GPU (ep 1, micro-batch 2 x 4096)"
    timeout $(limit 300) build/pith train $q8 --set run_dir="$W/q8-ep1" >"$W/q8-ep1.log" 2>&1
    grep -E "^(plan|step|done)|error" "$W/q8-ep1.log"
fi

if [ $pp2 = 1 ]; then
    echo "== the same at pp 2 (DualPipeV, global batch 8: 4 micro-batches through the pipeline)"
    timeout $(limit 300) $MPI build/pith train $q8 --set parallel.pipeline_parallel_size=2 --set global_batch_size=8 \
        --set run_dir="$W/q8-pp2" >"$W/q8-pp2.log" 2>&1
    grep -E "^(mesh|plan|step|done)|error" "$W/q8-pp2.log"
    cp "$W/q8-pp2/metrics.jsonl" "$OUT/q8-pp2-metrics.jsonl" 2>/dev/null
fi
cp "$W/bench_ep.jsonl" "$W/peer_a2a.jsonl" "$W/q8-ep2.log" "$OUT/" 2>/dev/null
cp "$W/q8-ep2/metrics.jsonl" "$OUT/q8-ep2-metrics.jsonl" 2>/dev/null
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
for name, gpus in (("q8-ep2", 2), ("q8-ep1", 1), ("q8-pp2", 2)):
    m = lines(f"{W}/{name}/metrics.jsonl")
    if not m:
        if name == "q8-ep2": print(f"\nQwen3-30B-A3B 8 layers, {name}: no steps (see {W}/{name}.log)")
        continue
    late = [s for s in m if s["step"] >= 3] or m  # as bench/report.py: steps 3.. (the first ones warm up)
    tokens = 2 * 4096 * (2 if name == "q8-pp2" else 1)  # per GPU and step (pp2: 8 x 4096 over 2 GPUs)
    fb = statistics.median(s["fwdbwd_s"] for s in late)
    st = statistics.median(s["step_time_s"] for s in late)
    print(f"\nQwen3-30B-A3B 8 layers, micro-batch 2 x 4096 per GPU, {'one GPU' if gpus == 1 else 'pp 2 on 2 GPUs' if name == 'q8-pp2' else 'ep 2 on 2 GPUs'}: "
          f"{tokens / fb:,.0f} tokens/s per GPU forward+backward ({fb:.3f} s), {tokens / st:,.0f} with the optimizer step ({st:.3f} s); "
          f"median of steps {late[0]['step']}..{m[-1]['step']}; GPU peak {max(s['gpu_peak_gb'] for s in m):.1f} GB; loss {m[0]['loss']:.3f} -> {m[-1]['loss']:.3f}")
EOF
