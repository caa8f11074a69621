#!/usr/bin/env bash
# pack_device2.sh — run on the development machine, from the repository root, before the two-GPU device call:
# builds build/{pith,test_gpu,test_parallel,bench_ep,bench_ring}, and packs into .gpu2/ (ignored through .git/info/exclude)
# what tests/gpu/run_device2.sh needs on a device that lacks the build's Debian libraries: the binaries
# (debug info stripped, gzipped) and every shared library they load that is neither glibc's, the CUDA/NCCL
# ones (the device has its own) nor Open MPI's (the device's mpirun must meet its own libmpi), gzipped.
# Then: device run with carry [".gpu2"] and command `bash tests/gpu/run_device2.sh` (two GPUs) or
# `bash tests/gpu/run_device2.sh --x8` (eight GPUs: issue 8's run; data/demo/tokens is packed when present), or
# `bash bench/run_x2.sh` (issue 23's whole two-GPU call).
set -euo pipefail
make -j"$(nproc)" GPU=1 build/pith build/test_gpu build/test_parallel build/bench_ep build/bench_ring >/dev/null
rm -rf .gpu2 && mkdir -p .gpu2/bin .gpu2/lib
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu2/' "$exclude" 2>/dev/null || echo '/.gpu2/' >>"$exclude"
bins=(pith test_gpu test_parallel bench_ep bench_ring)
for b in "${bins[@]}"; do strip -g -o ".gpu2/bin/$b" "build/$b" && gzip -9 ".gpu2/bin/$b"; done
bash scripts/pack_libs.sh .gpu2/lib "${bins[@]/#/build/}"
# the demo's tokens (make demo), for the full-node run (run_device2.sh --x8)
if [ -d data/demo/tokens ]; then mkdir -p .gpu2/data/demo && cp -r data/demo/tokens .gpu2/data/demo/; fi
echo "mpi here: $(mpirun --version 2>/dev/null | head -1)" >.gpu2/BUILT
echo "built: $(git rev-parse --short HEAD) $(date -u +%FT%TZ)" >>.gpu2/BUILT
ls -la .gpu2/bin .gpu2/lib
du -sh .gpu2
