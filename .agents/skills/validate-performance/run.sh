#!/usr/bin/env bash
# run.sh — on the GPU machine, from the repository root, .dev-agents/ carried (pack.sh): base against feature on the
# single-GPU benchmark in one session. bench/qwen3_30b_a3b_8l (Qwen3-30B-A3B shape cut to 8 layers, micro-batch
# 2 × 4096, bf16, synthetic tokens), STEPS steps (default 8) per run, in the order base natural, feature natural,
# base balanced (benchmark=true), feature balanced, then base natural again when under 150 s have passed.
# fwd+bwd time of a run = median of fwdbwd_s over steps ≥ 3. Noise band of a routing = the larger of the two runs'
# relative spread of fwdbwd_s over those steps ((max − min)/(2·median)) and, where it ran, the relative
# difference of the two base natural runs. Prints a table (also $OUT/table.md) and one verdict per routing:
# "faster"/"slower" when |delta| > band, else "within noise"; the last line is "validate-performance: PASS" when
# every run finished, step 1's losses agree within 1e-2 (bf16) and the feature is nowhere slower beyond the band,
# else "validate-performance: FAIL". BENCH=bench/deepseek_v2_lite_8l VOCAB=102400 measures DeepSeek-V2-Lite.
set -u
OUT=${OUT:-/tmp/pith-perf}
mkdir -p "$OUT"
. .agents/skills/validate-performance/setup.sh
bench=${BENCH:-bench/qwen3_30b_a3b_8l} steps=${STEPS:-8} t0=$(date +%s)
mkdir -p /tmp/pith-bench-data
"$BIN/feature/pith" synth --output /tmp/pith-bench-data/tokens.bin --vocab "${VOCAB:-151936}" --tokens 200000 --seed 1 >/dev/null
run() { # side routing name
    local extra=()
    [ "$2" = balanced ] && extra=(--set benchmark=true)
    rm -rf /tmp/pith-bench-run
    timeout 110 "$BIN/$1/pith" train "$bench/train.json" --set max_steps="$steps" --set tensorboard=false \
        ${extra[@]+"${extra[@]}"} >"$OUT/$3.txt" 2>&1
    echo "rc=$?" >>"$OUT/$3.txt"
    cp /tmp/pith-bench-run/metrics.jsonl "$OUT/$3.jsonl" 2>/dev/null
    echo "== $3 ($(($(date +%s) - t0)) s): $(grep -E '^step|error' "$OUT/$3.txt" | tail -1 | cut -c1-160)"
}
run base natural base-natural
run feature natural feature-natural
run base balanced base-balanced
run feature balanced feature-balanced
[ $(($(date +%s) - t0)) -lt 150 ] && run base natural base-natural-2
python3 - "$OUT" "$bench/train.json" <<'EOF'
import json, os, statistics, sys
out, cfg = sys.argv[1], json.load(open(sys.argv[2]))
tokens = cfg["global_batch_size"] * cfg["sequence_length"]
def load(name):
    p = f"{out}/{name}.jsonl"
    if not os.path.exists(p): return None
    rows = [json.loads(l) for l in open(p) if l.strip()]
    fb = [r["fwdbwd_s"] for r in rows if r["step"] >= 3]
    if not fb: return None
    med = statistics.median(fb)
    return {"ms": med * 1e3, "tps": tokens / med, "spread": (max(fb) - min(fb)) / (2 * med), "loss1": rows[0]["loss"],
            "peak": max(r.get("gpu_peak_gb", 0) for r in rows)}
ok, lines = True, ["| routing | base ms | feature ms | base tokens/s | feature tokens/s | delta | noise band | verdict |",
                   "|---|---:|---:|---:|---:|---:|---:|---|"]
for routing in ("natural", "balanced"):
    b, f = load(f"base-{routing}"), load(f"feature-{routing}")
    if not b or not f:
        ok = False; lines.append(f"| {routing} | run failed: see {out}/*-{routing}.txt |"); continue
    band = max(b["spread"], f["spread"])
    b2 = load("base-natural-2") if routing == "natural" else None
    if b2: band = max(band, abs(b2["ms"] - b["ms"]) / b["ms"])
    delta = f["ms"] / b["ms"] - 1  # positive: the feature takes longer
    verdict = "within noise" if abs(delta) <= band else ("slower" if delta > 0 else "faster")
    if verdict == "slower": ok = False
    if abs(f["loss1"] - b["loss1"]) > 1e-2 * abs(b["loss1"]):
        ok = False; verdict += f", step-1 loss differs ({b['loss1']:.5f} vs {f['loss1']:.5f})"
    lines.append(f"| {routing} | {b['ms']:.1f} | {f['ms']:.1f} | {b['tps']:,.0f} | {f['tps']:,.0f} | {delta:+.1%} "
                 f"| ±{band:.1%} | {verdict} |")
table = "\n".join(lines)
open(f"{out}/table.md", "w").write(table + "\n")
print(table)
print("validate-performance: " + ("PASS" if ok else "FAIL"))
EOF
