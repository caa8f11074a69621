#!/usr/bin/env bash
# run_gpu2.sh — the two-GPU benchmarks, from the repository root of a machine with two GPUs and the built
# binaries (build/pith, build/bench_ep; tests/gpu/run_device2.sh provides them on the device):
#   1. EP dispatch + combine (build/bench_ep: bf16 rows of 2048, top-8 of 128 experts, random routing,
#      T tokens per rank) against torch.distributed.all_to_all_single (bench/peer_a2a.py under torchrun) at
#      the same per-peer row counts; logical GB/s per GPU = rows each GPU sends (itself included) × 2048 × 2 B
#      over the time, the ranks' mean bytes over the slowest rank's time, a device sync after each call.
#   2. A Qwen3-30B-A3B-shaped model cut to 8 layers at ep2 (seq 4096, micro-batch 1 per rank, force-balanced
#      routing as PithTrain's benchmark mode), tokens/s per GPU (median over steps 2..N).
# Options: --quick (T = 4096 only, 4 steps), --baseline (also the 8-layer model on one GPU at ep 1).
# Work files under /tmp/pith-gpu2; copied to $OUT (at most 8 files come back from the device): the two
# .jsonl results, the 8-layer run's log and metrics. A table last.
set -u
OUT=${OUT:-/tmp/pith-out}
W=/tmp/pith-gpu2
mkdir -p "$W/splits" "$W/q8" "$OUT"
rm -f "$W"/splits/*.json
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI="mpirun --bind-to none -np 2"
# Each step's time limit keeps the whole script inside PITH_DEADLINE (epoch seconds; default 9 minutes
# from now), so the table at the end always prints.
deadline=${PITH_DEADLINE:-$(($(date +%s) + 540))}
limit() { local l=$((deadline - $(date +%s) - 20)); ((l > $1)) && l=$1; ((l < 5)) && l=5; echo $l; }
tokens=1024,4096,16384 steps=6 baseline=0
for a in "$@"; do case "$a" in --quick) tokens=4096 steps=4 ;; --baseline) baseline=1 ;; esac; done

echo "== pith dispatch + combine (build/bench_ep, T = $tokens per rank)"
timeout $(limit 150) $MPI build/bench_ep --tokens $tokens --iters 20 --splits "$W/splits" 2>&1 | tee "$W/bench_ep.log"
grep '^{' "$W/bench_ep.log" >"$W/bench_ep.jsonl"

echo "== torch.distributed.all_to_all_single at the same row counts"
PYTHONUNBUFFERED=1 timeout $(limit 150) python3 -m torch.distributed.run --standalone --nproc_per_node 2 bench/peer_a2a.py "$W/splits" --iters 20 2>&1 |
    tee "$W/peer_a2a.log"
grep '^{' "$W/peer_a2a.log" >"$W/peer_a2a.jsonl"

echo "== Qwen3-30B-A3B, 8 layers, ep2"
python3 - "$W/q8" "$steps" <<'EOF'
import json, sys
d, steps = sys.argv[1], int(sys.argv[2])
c = json.load(open("examples/qwen3-30b-a3b/config.json"))
c["num_hidden_layers"] = 8
json.dump(c, open(f"{d}/config.json", "w"), indent=1)
t = {"model": "config.json", "dataset": "data.bin", "sequence_length": 4096, "micro_batch_size": 1, "global_batch_size": 2,
     "max_steps": steps, "optimizer": {"type": "adamw", "lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1},
     "moe_load_balance_coef": 0.001, "device": "cuda", "benchmark": True, "parallel": {"expert_parallel_size": 2, "timeout_s": 300}}
json.dump(t, open(f"{d}/train.json", "w"), indent=1)
EOF
[ -s "$W/q8/data.bin" ] || build/pith synth --output "$W/q8/data.bin" --vocab 151936 --tokens 400000 >/dev/null
t0=$(date +%s)
timeout $(limit 300) $MPI build/pith train "$W/q8/train.json" --set run_dir="$W/q8-ep2" >"$W/q8-ep2.log" 2>&1
echo "rc=$? ($(($(date +%s) - t0)) s)"
grep -E "^(mesh|plan|step|done)|error" "$W/q8-ep2.log"
if [ $baseline = 1 ]; then
    echo "== the same on one GPU (ep 1)"
    timeout $(limit 300) build/pith train "$W/q8/train.json" --set parallel.expert_parallel_size=1 --set global_batch_size=1 --set run_dir="$W/q8-ep1" \
        >"$W/q8-ep1.log" 2>&1
    grep -E "^(plan|step|done)|error" "$W/q8-ep1.log"
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
for name, gpus in (("q8-ep2", 2), ("q8-ep1", 1)):
    m = lines(f"{W}/{name}/metrics.jsonl")
    if len(m) < 2:
        if name == "q8-ep2": print(f"\nQwen3-30B-A3B 8 layers, {name}: no steps (see {W}/{name}.log)")
        continue
    rest = m[1:]
    tps = statistics.median(s["tokens_per_s"] for s in rest) / gpus
    st = statistics.median(s["step_time_s"] for s in rest)
    fb = statistics.median(s["fwdbwd_s"] for s in rest)
    print(f"\nQwen3-30B-A3B 8 layers, seq 4096, micro-batch 1 per rank, {'ep 2 on 2 GPUs' if gpus == 2 else 'one GPU'}: "
          f"{tps:,.0f} tokens/s per GPU (step {st:.3f} s, forward+backward {fb:.3f} s, median of steps 2..{len(m)}), "
          f"GPU peak {max(s['gpu_peak_gb'] for s in m):.1f} GB, loss {m[0]['loss']:.3f} -> {m[-1]['loss']:.3f}")
EOF
