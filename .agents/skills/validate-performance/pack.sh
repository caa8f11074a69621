#!/usr/bin/env bash
# pack.sh — on the development machine: builds pith (with the CUDA backend: nvcc must be here) for a base and a
# feature, and packs what one GPU call needs into the ignored folder .dev-agents/ of the checkout it runs in:
#   base/pith.gz, feature/pith.gz, feature/bench_gpu_ops.gz (debug info stripped, gzipped), feature/kernel_events.so.gz
#   (.agents/skills/profile-gpu-step/kernel_events.c, the CUDA-event timer that run.sh preloads), lib/*.gz (every
#   shared library they load except glibc's, the CUDA/cuDNN/NCCL ones and Open MPI's, which the GPU machine has
#   itself) and BUILT (the refs and commits).
#   bash .agents/skills/validate-performance/pack.sh BASE FEATURE
# BASE and FEATURE are git refs (built in detached worktrees under /tmp, removed afterwards) or folders with
# build/pith and build/bench_gpu_ops already built. The device call then carries [".dev-agents"] and runs
# .agents/skills/validate-performance/run.sh (or .agents/skills/profile-gpu-step/run.sh); the checkout the device
# receives must hold those scripts (they are tracked files).
set -euo pipefail
[ $# = 2 ] || { sed -n 2,11p "$0" >&2; exit 2; }
top=$(git rev-parse --show-toplevel)
out=$top/.dev-agents
[ -x /usr/local/cuda/bin/nvcc ] || { echo "pack.sh: no nvcc here: a CPU-only pith cannot be measured on the GPU" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out/base" "$out/feature" "$out/lib"
git -C "$top" check-ignore -q "$out/" || echo '/.dev-agents/' >>"$(git -C "$top" rev-parse --git-path info/exclude)"
tmp=/tmp/pith-pack-$$
made=()
trap 'for d in ${made[@]+"${made[@]}"}; do git -C "$top" worktree remove --force "$d"; done' EXIT
: >"$out/BUILT"
bins=()
for side in base feature; do
    ref=$1 && shift
    if [ -d "$ref" ]; then dir=$(cd "$ref" && pwd); else
        dir=$tmp/$side
        git -C "$top" worktree add --detach "$dir" "$ref" >/dev/null
        made+=("$dir")
    fi
    want=(build/pith)
    [ $side = feature ] && want+=(build/bench_gpu_ops)
    echo "pack.sh: building $side ($ref) in $dir" >&2
    make -C "$dir" -j2 GPU=1 "${want[@]}" >"$tmp-$side-build.txt" 2>&1 || { tail -20 "$tmp-$side-build.txt" >&2; exit 1; }
    for b in "${want[@]}"; do
        strip -g -o "$out/$side/$(basename "$b")" "$dir/$b" && gzip -9 "$out/$side/$(basename "$b")"
        bins+=("$dir/$b")
    done
    echo "$side: $ref = $(git -C "$dir" rev-parse --short HEAD)$(git -C "$dir" diff --quiet HEAD || echo ' + uncommitted changes')" >>"$out/BUILT"
done
gcc -O2 -shared -fPIC -I/usr/local/cuda/include -o "$out/feature/kernel_events.so" \
    "$top/.agents/skills/profile-gpu-step/kernel_events.c" -ldl && gzip -9 "$out/feature/kernel_events.so"
bash "$top/scripts/pack_libs.sh" "$out/lib" "${bins[@]}"
echo "packed: $(date -u +%FT%TZ)" >>"$out/BUILT"
cat "$out/BUILT"
du -sh "$out"
