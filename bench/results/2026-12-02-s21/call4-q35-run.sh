#!/usr/bin/env bash
# Qwen3.5 at released dimensions, fp32 eval on the GPU: this tree (build) against 298df9b (build-cand), per token.
set -u
t0=$(date +%s)
python3 tests/hf/make_released.py qwen3_5_moe /tmp/hf35 >$OUT/make.txt 2>&1 || { tail -5 $OUT/make.txt; exit 1; }
echo "made in $(( $(date +%s) - t0 )) s"; grep -h loss /tmp/hf35/expected.json | head -3
build/pith convert hf2pith /tmp/hf35 /tmp/ck35 >/dev/null 2>&1 || echo convert failed
for b in build build-cand; do
    $b/pith eval --model /tmp/ck35 --data /tmp/hf35/tokens.bin --seq 4096 --batch 1 --device cuda --dtype fp32 \
        --per-token $OUT/pt_$b.npy 2>&1 | grep -E "loss|rror" | sed "s|^|$b: |"
done
PITH_WGRAD_STREAMS=1 build/pith eval --model /tmp/ck35 --data /tmp/hf35/tokens.bin --seq 4096 --batch 1 --device cuda \
    --dtype fp32 2>&1 | grep -E "loss" | sed "s|^|build, 1 stream: |"
python3 - $OUT <<'PY'
import numpy as np, sys
a = np.load(sys.argv[1] + "/pt_build.npy").astype(np.float64); b = np.load(sys.argv[1] + "/pt_build-cand.npy").astype(np.float64)
d = np.abs(a - b); ok = ~np.isnan(d)
print("tokens", a.size, "mean new", np.nanmean(a), "old", np.nanmean(b))
for t in (1e-6, 1e-5, 1e-4, 1e-3, 1e-2):
    print(f"|diff| > {t:g}: {int((d[ok] > t).sum())} tokens")
i = np.argsort(-np.nan_to_num(d))[:12]
print("largest:", [(int(j), round(float(d[j]), 6)) for j in i])
print("first token with |diff| > 1e-4:", int(np.argmax(d > 1e-4)) if (d > 1e-4).any() else None)
PY
echo "done in $(( $(date +%s) - t0 )) s"
