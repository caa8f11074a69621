#!/usr/bin/env bash
# run.sh — wg15's part of the shared device call (issue 15: the expert weight gradient's variants and the step's
# breakdown), from the repository root as `OUT=<dir> bash .dev-wg15/run.sh`, the environment set up by the lead
# (LD_LIBRARY_PATH, PITH_TEST_GPU=1, CS = compute-sanitizer). Budget 240 s; each phase is skipped when too little
# of it is left. Phases:
#   1. test_gpu gpu_op_grouped_wgmma with PITH_WG_VARIANTS="0 … 6": every case, each variant's weight
#      gradients (accumulate twice bit for bit, store over NaN) against the same CPU results
#   2. bench_gpu_ops --grouped wgmma: Qwen3's wgmma rows, then the four weight-gradient rows of each variant
#   3. bench/peer_grouped.py (wg15's copy, with fp32-output store rows): F.grouped_mm at the same shapes
#   4. the step's breakdown: pith train (8-layer Qwen3, balanced) for 2 and 6 steps under kernel_events.so, with
#      the fastest variant that passed 1; the per-call table is (6 − 2) / 4 steps
#   5. compute-sanitizer memcheck of gpu_op_grouped_wgmma (sanitizer's case list) over the register-store variants
set -u
T0=$(date +%s) D=.dev-wg15 B=build-wg15 O=${OUT:-/tmp/out-wg15}
mkdir -p $O $B
left() { echo $((240 - ($(date +%s) - T0))); }
for f in $D/bin/*.gz; do gunzip -c $f >$B/$(basename $f .gz); chmod +x $B/$(basename $f .gz); done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader >$O/summary.txt
VARS="0 1 2 3 4 5 6"
PITH_WG_VARIANTS="$VARS" timeout 70 $B/test_gpu gpu_op_grouped_wgmma >$O/test_wgmma.txt 2>&1
echo "rc=$?" >>$O/test_wgmma.txt
echo "test: $(grep -E 'passed|rc=' $O/test_wgmma.txt | tr '\n' ' ') ($((240 - $(left))) s)" >>$O/summary.txt
PITH_WG_VARIANTS="$VARS" timeout 45 $B/bench_gpu_ops --grouped wgmma >$O/bench_wgmma.txt 2>&1
echo "rc=$?" >>$O/bench_wgmma.txt
echo "bench: rc $(tail -1 $O/bench_wgmma.txt) ($((240 - $(left))) s)" >>$O/summary.txt
(timeout 50 python3 $D/peer_grouped.py >$O/peer_grouped.txt 2>&1; echo "rc=$?" >>$O/peer_grouped.txt)
echo "peer: $(tail -1 $O/peer_grouped.txt) ($((240 - $(left))) s)" >>$O/summary.txt
# the variants that passed every case, fastest first by the balanced store rows (gate_up + down)
python3 - $O $VARS >$O/verdict.txt <<'PY'
import re, sys
o, vs = sys.argv[1], sys.argv[2:]
ok = {v: None for v in vs}
text = open(f"{o}/test_wgmma.txt", errors="replace").read()
finished = re.search(r"\d+ passed, \d+ failed", text) is not None  # (a crash leaves later cases unrun)
for l in text.splitlines():
    m = re.search(r"variant (\d+): .*accumulate\)\s+vs cpu (\S+), .*store\)\s+vs cpu (\S+?)(;|$)", l.strip())
    if m:
        v, a, s = m.group(1), float(m.group(2)), float(m.group(3).rstrip(','))
        good = a <= 1e-5 and s <= 1e-5 and "differ" not in l
        ok[v] = good if ok[v] is None else ok[v] and good
ms = {}
for l in open(f"{o}/bench_wgmma.txt", errors="replace"):
    m = re.match(r"BENCH\|qwen3 (\S+) bwd weight fp32 store \(T=8192, balanced, wgmma v(\d+)\)\|([\d.]+)", l)
    if m: ms.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
rows = []
for v in vs:
    t = ms.get(v, {})
    tot = t["gate_up"] + t["down"] if len(t) == 2 else float("inf")
    rows.append((tot, v, bool(ok[v]) and finished, t))
rows.sort()
for tot, v, good, t in rows:
    print(f"variant {v}: test {'pass' if good else 'FAIL/absent'}; store gate_up {t.get('gate_up', float('nan')):.3f} "
          f"+ down {t.get('down', float('nan')):.3f} = {tot:.3f} ms")
best = [v for tot, v, good, t in rows if good and tot < float("inf")]
print("best", best[0] if best else "none")
PY
cat $O/verdict.txt >>$O/summary.txt
BEST=$(awk '/^best/ {print $2}' $O/verdict.txt)
[ "$BEST" = none ] && BEST=0
# the step's breakdown under the chosen variant (balanced routing, the benchmark's 2 × 4096 tokens)
mkdir -p /tmp/pith-bench-data
$B/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
for n in 2 6; do
    l=$(left); [ $l -lt 50 ] && { echo "profile $n: skipped ($l s left)" >>$O/summary.txt; continue; }
    rm -rf /tmp/pith-bench-run
    PITH_WG_VARIANT=$BEST PITH_KERNEL_EVENTS=$O/events-$n.tsv LD_PRELOAD=$PWD/$B/kernel_events.so \
        timeout $((l - 5)) $B/pith train bench/qwen3_30b_a3b_8l/train.json --set max_steps=$n \
        --set tensorboard=false --set benchmark=true >$O/train-$n.txt 2>&1
    echo "rc=$?" >>$O/train-$n.txt
    cp /tmp/pith-bench-run/metrics.jsonl $O/metrics-$n.jsonl 2>/dev/null
    echo "profile $n steps (variant $BEST): $(tail -1 $O/train-$n.txt) ($((240 - $(left))) s)" >>$O/summary.txt
done
python3 - $O >$O/step_kernels.md 2>&1 <<'PY'
import json, os, re, statistics, sys
o = sys.argv[1]
def table(n):
    t = {}
    if os.path.exists(f"{o}/events-{n}.tsv"):
        for line in open(f"{o}/events-{n}.tsv"):
            calls, ms, name = line.rstrip("\n").split("\t", 2)
            t[name] = (int(calls), float(ms))
    return t
a, b = table(2), table(6)
rows = sorted((((ms - a.get(k, (0, 0.0))[1]) / 4, (c - a.get(k, (0, 0.0))[0]) / 4, k) for k, (c, ms) in b.items()),
              reverse=True)
total = sum(r[0] for r in rows) or 1.0
KINDS = ["fwd", "dx", "dw +=", "dw ="]
def family(k):  # kernels by name (the wgmma kernels by kind), products by library call
    m = re.match(r"wgmma_grouped_kernel<(\d+),(\d+),(\d+)>", k)
    if m:
        return f"wgmma {KINDS[int(m.group(1))]}"
    return k.split(" ")[0] if k.startswith(("cublas", "cudnn")) else re.sub(r"<.*", "", k)
fam = {}
for ms, c, k in rows:
    f = fam.setdefault(family(k), [0.0, 0.0]); f[0] += ms; f[1] += c
print("| family | ms/step | calls/step | share |\n|---|---:|---:|---:|")
for k, (ms, c) in sorted(fam.items(), key=lambda x: -x[1][0]):
    print(f"| {k} | {ms:.3f} | {c:g} | {ms / total:.1%} |")
print("\n| call | ms/step | calls/step | share |\n|---|---:|---:|---:|")
for ms, c, k in rows[:45]:
    print(f"| {k[:110]} | {ms:.3f} | {c:g} | {ms / total:.1%} |")
if os.path.exists(f"{o}/metrics-6.jsonl"):
    R = [json.loads(l) for l in open(f"{o}/metrics-6.jsonl") if l.strip()][2:]
    if R:
        st = statistics.median(r["step_time_s"] for r in R) * 1e3
        fb = statistics.median(r["fwdbwd_s"] for r in R) * 1e3
        print(f"\nsum of timed calls {total:.1f} ms per step; step (steps 3-6, events on) {st:.1f} ms, fwd+bwd {fb:.1f} ms")
PY
head -25 $O/step_kernels.md >>$O/summary.txt
# memcheck on the register-store variants, the sanitizer's shorter case list
l=$(left)
if [ $l -gt 30 ]; then
    PITH_TEST_SANITIZE=1 PITH_WG_VARIANTS="1 2 3 5 6" timeout $((l - 5)) ${CS:-compute-sanitizer} --tool memcheck \
        $B/test_gpu gpu_op_grouped_wgmma >$O/memcheck_wgmma.txt 2>&1
    echo "rc=$?" >>$O/memcheck_wgmma.txt
    echo "memcheck: $(grep -E 'ERROR SUMMARY|passed|rc=' $O/memcheck_wgmma.txt | tr '\n' ' ')" >>$O/summary.txt
else echo "memcheck: skipped ($l s left)" >>$O/summary.txt; fi
echo "== wg15 ($((240 - $(left))) s)"
cat $O/summary.txt
