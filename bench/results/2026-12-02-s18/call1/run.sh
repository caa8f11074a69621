#!/usr/bin/env bash
# Released-dimension parity: transformers fp32/fp64 against pith fp32 on the GPU (and the CPU for GPT-OSS), with
# GPT-OSS variants that switch off YaRN and the sliding window to find what differs.
set -u
OUT=${OUT:-/tmp/h/rel}; mkdir -p $OUT; S=$OUT/summary.txt; : >$S
T0=$(date +%s)
one() { # one NAME FAMILY [CPU] [--set ...]
    local name=$1 fam=$2 cpu=$3; shift 3
    local d=/tmp/rel/$name; rm -rf /tmp/rel; mkdir -p /tmp/rel
    local t=$(date +%s)
    python3 tests/hf/make_released.py $fam $d/hf "$@" >$OUT/$name.txt 2>&1 || { echo "$name: generator failed" >>$S; tail -5 $OUT/$name.txt >>$S; return; }
    local t1=$(date +%s)
    build/pith convert hf2pith $d/hf $d/ck >>$OUT/$name.txt 2>&1 || { echo "$name: convert failed" >>$S; tail -3 $OUT/$name.txt >>$S; return; }
    local t2=$(date +%s)
    build/pith eval --model $d/ck --data $d/hf/tokens.bin --seq 4096 --batch 1 --device cuda --dtype fp32 >$OUT/$name.gpu.txt 2>&1
    local t3=$(date +%s)
    [ $cpu = cpu ] && OMP_NUM_THREADS=16 timeout 200 build/pith eval --model $d/ck --data $d/hf/tokens.bin --seq 4096 --batch 1 --device cpu >$OUT/$name.cpu.txt 2>&1
    python3 - $name $d/hf/expected.json $OUT/$name.gpu.txt $OUT/$name.cpu.txt <<'PY' >>$S 2>&1
import json, re, sys, os
n, e = sys.argv[1], json.load(open(sys.argv[2]))
def loss(p):
    if not os.path.exists(p): return None
    m = re.search(r"loss ([0-9.eE+-]+)", open(p).read()); return float(m.group(1)) if m else None
g, c = loss(sys.argv[3]), loss(sys.argv[4])
f32, f64 = e["loss"], e["loss_fp64"]
r = lambda a, b: f"{(a - b) / b:+.2e}" if a is not None else "—"
print(f"{n}: hf32 {f32:.9f} hf64 {f64:.9f} (hf32−hf64 {r(f32, f64)}); pith gpu {g} (vs hf32 {r(g, f32)}, vs hf64 {r(g, f64)}); pith cpu {c} (vs hf64 {r(c, f64)})")
PY
    echo "   $name: gen $((t1 - t)) s, convert $((t2 - t1)) s, eval gpu $((t3 - t2)) s, cpu $(($(date +%s) - t3)) s" >>$S
}
one gpt_oss gpt_oss cpu
one gpt_oss_norope gpt_oss no --set rope_scaling=null
one gpt_oss_full gpt_oss no --set 'layer_types=["full_attention","full_attention"]'
one qwen3_moe qwen3_moe no
one deepseek_v2 deepseek_v2 no
one qwen3_5_moe qwen3_5_moe no
echo "total $(($(date +%s) - T0)) s" >>$S
cat $S
