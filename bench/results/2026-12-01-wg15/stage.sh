#!/usr/bin/env bash
# stage.sh — on the development machine, from the worktree root after `make -j2 build/pith build/test_gpu
# build/bench_gpu_ops`: stages the stripped, gzipped binaries (the weight gradient's variants are chosen at run time
# by PITH_WG_VARIANT), kernel_events.so (.agents/skills/profile-gpu-step/SKILL.md), this folder's run.sh and
# bench/peer_grouped.py into $D (default /work/main/.dev-wg15/) for the lead's shared device call.
set -eu
D=${D:-/work/main/.dev-wg15}
rm -rf "$D" && mkdir -p "$D/bin"
for b in pith test_gpu bench_gpu_ops; do strip -g -o $D/bin/$b build/$b && gzip -9 $D/bin/$b; done
gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o $D/bin/kernel_events.so \
    .agents/skills/profile-gpu-step/kernel_events.c -ldl
gzip -9 $D/bin/kernel_events.so
cp bench/results/2026-12-01-wg15/run.sh bench/peer_grouped.py $D/
echo "built at $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty') on $(date -u)" >$D/BUILT
du -sh $D
