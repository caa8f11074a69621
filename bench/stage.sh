#!/usr/bin/env bash
# stage.sh NAME [BUILD] — on the development machine, before a bench/session.sh device call: builds pith, test_gpu and
# bench_gpu_ops with the CUDA backend into BUILD (default build-cuda) of the checkout it runs in, and packs them
# (debug info stripped, xz) into .gpu/bin (NAME main), .gpu/cand (NAME cand) or .gpu/NAME (a third build, session.sh's
# BIN NAME), with the libraries they load that the device lacks in .gpu/lib (scripts/pack_libs.sh, xz) and a line
# naming the commit in .gpu/BUILT. Run it from each tree to stage (a worktree holding a variant stages into the main
# checkout's .gpu with STAGE_TO=/path/to/main). The device call then carries [".gpu"] (at most 64 MiB).
set -euo pipefail
[ $# -ge 1 ] || { sed -n 2,7p "$0" >&2; exit 2; }
name=$1 build=${2:-build-cuda}
top=$(git rev-parse --show-toplevel)
to=${STAGE_TO:-$top}/.gpu
case $name in main) dir=$to/bin ;; cand) dir=$to/cand ;; bin | lib | kjv) echo "stage.sh: $name is reserved" >&2; exit 2 ;;
*) dir=$to/$name ;; esac
[ -x /usr/local/cuda/bin/nvcc ] || { echo "stage.sh: no nvcc here: the device runs what is built here" >&2; exit 1; }
bins=(pith test_gpu bench_gpu_ops)
echo "stage.sh: building ${bins[*]} in $top/$build" >&2
# A build folder copied from another (cp -a build-cuda build-cand, to skip a full rebuild) keeps dependency files
# naming the other folder's objects, so a changed header would rebuild nothing: name this folder's instead.
[ -d "$top/$build" ] && find "$top/$build" -name '*.d' -exec sed -i "s#\\(^\\| \\)build[-a-z0-9]*/#\\1$build/#g" {} +
nice make -C "$top" GPU=1 BUILD="$build" -j2 "${bins[@]/#/$build/}" >/tmp/stage-$name.log 2>&1 ||
    { tail -20 /tmp/stage-$name.log >&2; exit 1; }
mkdir -p "$dir" "$to/lib"
for b in "${bins[@]}"; do
    t=$(mktemp /tmp/stage-XXXXXX)
    strip -g -o "$t" "$top/$build/$b" && xz -9 -T2 -c "$t" >"$dir/$b.xz" && rm -f "$t"
done
if ! ls "$to/lib"/*.xz >/dev/null 2>&1; then # the libraries once: every build loads the same ones
    bash "$top/scripts/pack_libs.sh" "$to/lib" "${bins[@]/#/$top/$build/}"
    for f in "$to/lib"/*.gz; do gunzip -c "$f" | xz -9 -T2 >"${f%.gz}.xz" && rm -f "$f"; done
fi
echo "$name: $(git -C "$top" rev-parse --short HEAD)$(git -C "$top" diff --quiet HEAD || echo ' + uncommitted changes') ($(date -u +%FT%TZ))" >>"$to/BUILT"
du -sh "$to" >&2
