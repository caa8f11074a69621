#!/usr/bin/env bash
# run.sh MODE — on the device, from the repository root, with .dev-perf carried: bin/ (stripped, gzipped builds:
# pith, bench_gpu_ops, kernel_events.so, test_gpu; base-pith for the A/B), lib/ (scripts/pack_libs.sh), peer
# scripts. Logs under /tmp/logs, returned as $OUT/logs.tgz beside $OUT/summary.txt, both rewritten after every
# phase (save), so a call stopped at its limit still returns what it finished. MODEs:
#   profile  bench_gpu_ops --grouped (expert GEMMs alone), bench/peer_grouped.py (F.grouped_mm, same shapes), then
#            the per-call CUDA-event table of a real step (.agents/skills/profile-gpu-step's method: 2 and 6 steps,
#            the difference / 4) for natural and force-balanced routing, side by side
#   final    the GPU op tests of the changed kernels (+ memcheck / racecheck), base vs feature (validate-performance's
#            method: 8 steps, median fwd+bwd of steps >= 3, natural and balanced, base natural twice for the
#            noise), bench_gpu_ops --grouped, and HF + torch.compile (bench/peer_hf_qwen3_moe.py)
set -u
RET=${OUT:-/tmp/out}; OUT=/tmp/logs; D=.dev-perf; B=/tmp/pbin; mkdir -p "$RET" "$OUT" $B /tmp/pl
t0=$(date +%s); el() { echo $(($(date +%s) - t0)); }
save() { cp $OUT/summary.txt $OUT/step_kernels.md $RET/ 2>/dev/null; tar czf $RET/logs.tgz -C /tmp logs; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv,noheader; date -u; cat $D/BUILT
for f in $D/bin/*.gz; do gunzip -c "$f" >$B/$(basename "$f" .gz); chmod +x $B/$(basename "$f" .gz); done
for f in $D/lib/*.gz; do gunzip -c "$f" >/tmp/pl/$(basename "$f" .gz); done
export LD_LIBRARY_PATH=/tmp/pl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ldd $B/pith | grep -q "libmpi.so.40 => not found"; then
    export LD_LIBRARY_PATH=$(dirname "$(readlink -f "$(command -v mpirun)")")/../lib:$LD_LIBRARY_PATH
fi
if [ ! -e /usr/local/cuda/lib64/libcublasLt.so.13 ]; then
    for d in /opt/torch/.venv/lib/python3*/site-packages/nvidia/*/lib; do export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$d; done
fi
ldd $B/pith | grep "not found"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PITH_TEST_GPU=1 PYTHONUNBUFFERED=1
CFG=bench/qwen3_30b_a3b_8l/train.json
mkdir -p /tmp/pith-bench-data
$B/pith synth --output /tmp/pith-bench-data/tokens.bin --vocab 151936 --tokens 200000 --seed 1 >/dev/null
train() { # train NAME BINARY STEPS EXTRA...: metrics of the run into $OUT/metrics_NAME.jsonl
    local n=$1 bin=$2 steps=$3; shift 3
    rm -rf /tmp/pith-bench-run
    timeout 90 $bin train $CFG --set max_steps=$steps --set tensorboard=false "$@" >$OUT/train_$n.txt 2>&1
    echo "rc=$? ($(el) s)" >>$OUT/train_$n.txt; tail -1 $OUT/train_$n.txt
    cp /tmp/pith-bench-run/metrics.jsonl $OUT/metrics_$n.jsonl 2>/dev/null
    save
}
grouped() {
    timeout 60 $B/bench_gpu_ops --grouped >$OUT/bench_grouped.txt 2>&1; echo "rc=$? ($(el) s)" >>$OUT/bench_grouped.txt
    timeout 60 python3 bench/peer_grouped.py >$OUT/peer_grouped.txt 2>&1; echo "rc=$? ($(el) s)" >>$OUT/peer_grouped.txt
    python3 - $OUT <<'PY' | tee -a $OUT/summary.txt
import re, sys
out = sys.argv[1]
def rows(path, tag):
    r = {}
    for l in open(path):
        if l.startswith(tag + "|"):
            f = l.rstrip("\n").split("|")
            r[f[1]] = float(f[2]) if f[2] != "nan" else float("nan")
    return r
ours, peer = rows(f"{out}/bench_grouped.txt", "BENCH"), rows(f"{out}/peer_grouped.txt", "PEER")
print("| product (T=8192) | wgmma ms | TF/s | F.grouped_mm ms | ratio |\n|---|---:|---:|---:|---:|")
for name, ms in ours.items():
    if not name.endswith(", wgmma)"): continue
    p = peer.get(name.replace(" store", "").replace(", wgmma)", ", torch)"), float("nan")) # the peer writes bf16 dw
    w = 2.0 * 65536 * 768 * 2048 * (2 if "gate_up" in name else 1) if "qwen3" in name else 2.0 * 49152 * 1408 * 2048 * (2 if "gate_up" in name else 1)
    print(f"| {name.replace(', wgmma)', ')')} | {ms:.3f} | {w / ms / 1e9:.0f} | {p:.3f} | {p / ms:.2f}x |")
PY
    save
}
case "${1:-profile}" in
profile)
    grouped
    for bal in 0 1; do
        x=(); [ $bal = 1 ] && x=(--set benchmark=true)
        for n in 2 6; do
            PITH_KERNEL_EVENTS=$OUT/events-$bal-$n.tsv LD_PRELOAD=$B/kernel_events.so train ev$bal-$n $B/pith $n ${x[@]+"${x[@]}"}
        done
    done
    python3 - $OUT <<'PY' | tee $OUT/step_kernels.md
import json, os, statistics, sys
out = sys.argv[1]
def table(p):
    t = {}
    if os.path.exists(p):
        for line in open(p):
            c, ms, name = line.rstrip("\n").split("\t", 2)
            t[name] = (int(c), float(ms))
    return t
per = {}
for bal in (0, 1):
    a, b = table(f"{out}/events-{bal}-2.tsv"), table(f"{out}/events-{bal}-6.tsv")
    for name, (c, ms) in b.items():
        c0, m0 = a.get(name, (0, 0.0))
        per.setdefault(name, [0.0, 0.0, 0.0, 0.0])
        per[name][2 * bal], per[name][2 * bal + 1] = (ms - m0) / 4, (c - c0) / 4
    R = [json.loads(l) for l in open(f"{out}/metrics_ev{bal}-6.jsonl")][2:] if os.path.exists(f"{out}/metrics_ev{bal}-6.jsonl") else []
    if R:
        print(f"{'balanced' if bal else 'natural'}: step {statistics.median(r['step_time_s'] for r in R)*1e3:.1f} ms, "
              f"fwd+bwd {statistics.median(r['fwdbwd_s'] for r in R)*1e3:.1f} ms (events on)")
tn, tb = sum(v[0] for v in per.values()), sum(v[2] for v in per.values())
print(f"sum of timed calls: natural {tn:.1f} ms, balanced {tb:.1f} ms\n")
print("| call | natural ms/step | calls | balanced ms/step | calls | bal - nat |\n|---|---:|---:|---:|---:|---:|")
for name, v in sorted(per.items(), key=lambda kv: -max(kv[1][0], kv[1][2]))[:60]:
    print(f"| {name} | {v[0]:.3f} | {v[1]:g} | {v[2]:.3f} | {v[3]:g} | {v[2]-v[0]:+.3f} |")
print("\n| largest differences (balanced - natural) | ms |\n|---|---:|")
for name, v in sorted(per.items(), key=lambda kv: -abs(kv[1][2] - kv[1][0]))[:25]:
    print(f"| {name} | {v[2]-v[0]:+.3f} |")
PY
    ;;
final)
    F=${FILTER:-gpu_op_elementwise gpu_op_rmsnorm gpu_op_grouped_wgmma gpu_model_bf16 gpu_model_gpt_oss gpu_model_fp8 gpu_train_tracks_cpu}
    timeout 120 $B/test_gpu $F >$OUT/test_gpu.txt 2>&1; echo "rc=$? ($(el) s)" >>$OUT/test_gpu.txt
    grep -E "^FAIL|passed|rc=" $OUT/test_gpu.txt | tee -a $OUT/summary.txt
    for tool in memcheck racecheck; do
        timeout 60 compute-sanitizer --tool $tool $B/test_gpu ${SAN:-gpu_op_grouped_wgmma} >$OUT/san_$tool.txt 2>&1
        echo "$tool rc=$? ($(el) s): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $OUT/san_$tool.txt | tail -1)" | tee -a $OUT/summary.txt
    done
    save
    for r in natural balanced; do
        x=(); [ $r = balanced ] && x=(--set benchmark=true)
        train base_$r $B/base-pith 8 ${x[@]+"${x[@]}"}
        train feat_$r $B/pith 8 ${x[@]+"${x[@]}"}
        [ $r = natural ] && train base2_$r $B/base-pith 8
    done
    [ $(el) -lt ${PEER_BY:-600} ] && { timeout 180 python3 bench/peer_hf_qwen3_moe.py --compile >$OUT/peer_hf.txt 2>&1; echo "rc=$? ($(el) s)" >>$OUT/peer_hf.txt; grep '^{' $OUT/peer_hf.txt | tee -a $OUT/summary.txt; }
    [ $(el) -lt ${GROUPED_BY:-600} ] && grouped
    python3 - $OUT <<'PY' | tee -a $OUT/summary.txt
import json, os, statistics, sys
out = sys.argv[1]
def med(n):
    p = f"{out}/metrics_{n}.jsonl"
    if not os.path.exists(p): return None
    R = [json.loads(l) for l in open(p) if l.strip()]
    if len(R) < 8: return None
    S = R[2:]
    fb = statistics.median(r["fwdbwd_s"] for r in S); st = statistics.median(r["step_time_s"] for r in S)
    spread = (max(r["fwdbwd_s"] for r in S) - min(r["fwdbwd_s"] for r in S)) / (2 * fb)
    return fb, st - fb, spread, R[0]["loss"], max((r.get("gpu_peak_gb") or 0) for r in R)
print("| run | fwd+bwd ms | tokens/s | optimizer ms | spread | step-1 loss | GPU peak |\n|---|---:|---:|---:|---:|---:|---:|")
M = {}
for n in ("base_natural", "base2_natural", "feat_natural", "base_balanced", "feat_balanced"):
    m = M[n] = med(n)
    if m: print(f"| {n} | {m[0]*1e3:.1f} | {8192/m[0]:,.0f} | {m[1]*1e3:.1f} | {m[2]:.1%} | {m[3]:.4f} | {m[4]:.1f} GB |")
for r in ("natural", "balanced"):
    b, f = M[f"base_{r}"], M[f"feat_{r}"]
    if not (b and f): print(f"{r}: missing runs"); continue
    band = max(b[2], f[2], abs(M["base2_natural"][0] / b[0] - 1) if r == "natural" and M["base2_natural"] else 0)
    d = f[0] / b[0] - 1
    print(f"{r}: feature/base fwd+bwd {d:+.1%} (band {band:.1%}): {'faster' if d < -band else 'slower' if d > band else 'within noise'}; optimizer {f[1]*1e3:.1f} vs {b[1]*1e3:.1f} ms")
PY
    ;;
esac
echo "== summary ($(el) s)"; cat $OUT/summary.txt 2>/dev/null
save
