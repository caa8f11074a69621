#!/usr/bin/env bash
# pack_libs.sh OUT_DIR BINARY... — for a device call that runs binaries built on the development machine: gzips into
# OUT_DIR (as NAME.gz) every shared library the binaries load except glibc's, the CUDA, cuDNN and NCCL ones and
# Open MPI's own closure, which the GPU machine has itself (its mpirun must meet its own libmpi).
set -euo pipefail
out=$1
shift
mkdir -p "$out"
mpi=$(ldd "$(ldd "$1" | awk '/libmpi\.so/ {print $3}')" | awk '{print $1}')
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libgcc_s\.|libstdc\+\+|libcudart|libcublas|libnccl|libcudnn|libmpi)'
for b in "$@"; do ldd "$b"; done | awk '$2 == "=>" {print $1, $3}' | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    grep -qx "$name" <<<"$mpi" && continue
    gzip -9 -c "$path" >"$out/$name.gz"
done
