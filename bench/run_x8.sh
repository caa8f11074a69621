#!/usr/bin/env bash
# run_x8.sh — the full-node run of issue 8, from the repository root of an 8-GPU machine (nvidia-h200-x8)
# with the binaries (tests/gpu/pack_device2.sh packs them and the demo's tokens; on the device
# `bash tests/gpu/run_device2.sh --x8` unpacks them and runs this): Qwen3-30B-A3B (examples/qwen3-30b-a3b:
# 48 layers, 128 experts top-8, hidden 2048, vocab 151936) at pp 1, ep 8, FSDP over the 8 ranks, sequence
# 4096, micro-batch 1 per rank, bf16, on the demo's tokenized KJV (data/demo/tokens; `make demo` makes it):
#   1. `pith estimate` for each run (the plan per rank);
#   2. WARM + STEPS steps with force-balanced routing (`benchmark: true`) and capacity factor 1.25 — the
#      throughput figure; then the same with natural routing and capacity factor 2.0 (routing at
#      initialisation is skewed: on one GPU the largest of 128 experts held up to 12× the mean rows, so 1.25
#      could overflow, which stops the run with a message rather than dropping tokens);
#   3. a table: tokens/s and TFLOP/s per GPU (median of the steps after WARM), MFU against 989 TFLOP/s,
#      GPU peak per rank against the plan, and the losses of the natural run.
# The same script runs small on CPUs for a dry run of its plumbing:
#   NP=2 CONFIG=examples/tiny/train.json DATA=data/tiny DEVICE=cpu GPU_MEMORY=0 STEPS=4 WARM=1 bash bench/run_x8.sh
# Work files under /tmp/pith-x8; the logs, metrics and the table go to $OUT (8 files at most).
set -u
OUT=${OUT:-/tmp/pith-out}
W=/tmp/pith-x8
NP=${NP:-8}
CONFIG=${CONFIG:-examples/qwen3-30b-a3b/train.json}
DATA=${DATA:-data/demo/tokens}
STEPS=${STEPS:-30}
WARM=${WARM:-3}
GPU_MEMORY=${GPU_MEMORY:-141} # GB per GPU for `pith estimate`; 0 skips the estimate's fit check
DEVICE=${DEVICE:-cuda}        # the config's device, for `pith estimate`
mkdir -p "$OUT" "$W"
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
[ -x build/pith ] || { echo "run_x8: build/pith is missing"; exit 1; }
[ -e "$DATA" ] || { echo "run_x8: no token data at $DATA (make demo writes data/demo/tokens)"; exit 1; }
data=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
sets="--set dataset=$data --set micro_batch_size=1 --set global_batch_size=$NP --set max_steps=$((WARM + STEPS))"
sets="$sets --set parallel.expert_parallel_size=$NP --set parallel.timeout_s=600"
for run in balanced:true:1.25 natural:false:2.0; do
    IFS=: read -r name bench cf <<<"$run"
    est="--set parallel.ep_capacity_factor=$cf --device $DEVICE"
    [ "$GPU_MEMORY" != 0 ] && est="$est --gpu-memory $GPU_MEMORY"
    build/pith estimate "$CONFIG" --gpus "$NP" $sets $est >"$W/estimate-$name.txt" 2>&1
    grep -E "^estimate|total|fit" "$W/estimate-$name.txt"
    echo "== $name routing ($((WARM + STEPS)) steps, capacity factor $cf)"
    rm -rf "$W/$name"
    t0=$(date +%s)
    timeout 1500 mpirun --bind-to none --tag-output -np "$NP" build/pith train "$CONFIG" $sets --set benchmark="$bench" \
        --set parallel.ep_capacity_factor="$cf" --set run_dir="$W/$name" >"$W/$name.log" 2>&1
    echo "rc=$? ($(($(date +%s) - t0)) s)"
    grep -E "^\[1,0\]<stdout>:(mesh|plan|done)|error" "$W/$name.log" | head -8
    cp "$W/$name.log" "$OUT/x8-$name.log"
    cp "$W/$name/metrics.jsonl" "$OUT/x8-$name-metrics.jsonl" 2>/dev/null
    cp "$W/estimate-$name.txt" "$OUT/x8-estimate-$name.txt"
done
python3 - "$W" "$CONFIG" "$WARM" "$NP" <<'EOF' | tee "$OUT/x8-table.md"
import json, os, re, statistics, sys
W, config, warm, ranks = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
train = json.load(open(config))
mc = json.load(open(os.path.join(os.path.dirname(config), train["model"])))
H, L, V = mc["hidden_size"], mc["num_hidden_layers"], mc["vocab_size"]
nh, nkv = mc["num_attention_heads"], mc["num_key_value_heads"]
d = mc.get("head_dim", H // nh)
E, k, I = mc["num_experts"], mc["num_experts_per_tok"], mc["moe_intermediate_size"]
S = train["sequence_length"]
# FLOPs per token, forward (as bench/report.py): projections, causal attention (half of S² scores),
# router, k experts of SwiGLU, LM head; forward + backward = 3 × forward.
proj = 2 * H * (nh * d + 2 * nkv * d) + 2 * nh * d * H
attn = 2 * 2 * S * nh * d / 2
router = 2 * H * E
experts = k * 3 * 2 * H * I
fwd = L * (proj + attn + router + experts) + 2 * H * V
flops = 3 * fwd
tokens = S  # per GPU and step: one micro-batch of 1 × S
print(f"\nQwen3-MoE from {config}: {L} layers, {E} experts top-{k}; {ranks} ranks, ep {ranks}, sequence {S}, micro-batch 1 per rank")
print(f"FLOPs per token fwd+bwd: 3 × ({L} × {(proj + attn + router + experts) / 1e6:.2f}M + LM head {2 * H * V / 1e6:.2f}M) = {flops / 1e9:.3f} G\n")
print("| routing | tokens/s per GPU (fwd+bwd) | tokens/s per GPU (step) | TFLOP/s per GPU | MFU | GPU peak per rank (GB) | plan (GB) | estimate (GB) |")
print("|---|---:|---:|---:|---:|---|---:|---:|")
losses = {}
for name in ("balanced", "natural"):
    mpath = f"{W}/{name}/metrics.jsonl"
    m = [json.loads(l) for l in open(mpath)] if os.path.exists(mpath) else []
    losses[name] = [r["loss"] for r in m]
    late = [r for r in m if r["step"] > warm]
    est = re.search(r"total.*\((\d+) bytes\)", open(f"{W}/estimate-{name}.txt").read()) if os.path.exists(f"{W}/estimate-{name}.txt") else None
    est = f"{int(est.group(1)) / 1e9:.3f}" if est else "-"
    peaks, plan = {}, ""
    if os.path.exists(f"{W}/{name}.log"):
        for line in open(f"{W}/{name}.log"):
            g = re.match(r"\[1,(\d+)\]<stdout>:step .*gpu-peak-mem ([\d.]+) GB \(plan ([\d.]+) GB\)", line)
            if g: peaks[int(g.group(1))], plan = float(g.group(2)), g.group(3)
    if not late:
        print(f"| {name} | no steps after warm-up (see x8-{name}.log) | | | | | | {est} |")
        continue
    fb = statistics.median(r["fwdbwd_s"] for r in late)
    st = statistics.median(r["step_time_s"] for r in late)
    tps = tokens / fb
    peak = " ".join(f"{peaks[r]:.1f}" for r in sorted(peaks)) or "-"
    print(f"| {name} | {tps:,.0f} | {tokens / st:,.0f} | {tps * flops / 1e12:.1f} | {100 * tps * flops / 989e12:.1f}% | {peak} | {plan} | {est} |")
for name, ls in losses.items():
    if ls: print(f"\nloss, {name} routing, steps 1..{len(ls)}: " + " ".join(f"{x:.3f}" for x in ls))
EOF
