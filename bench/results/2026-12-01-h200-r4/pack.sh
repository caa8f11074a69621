#!/usr/bin/env bash
# pack.sh — from the development machine, in a worktree with build/ made: strip + gzip build/{pith,test_gpu,
# bench_gpu_ops} and the Debian libraries they need (not those the device has: CUDA, cuDNN, NCCL, MPI) into
# /work/main/.dev-perf/, with the scripts and bench configs the device run reads (carry [".dev-perf"]).
set -e
D=/work/main/.dev-perf
rm -rf $D && mkdir -p $D/bin $D/lib
for b in pith test_gpu bench_gpu_ops; do strip -g -o $D/bin/$b build/$b && gzip -9 $D/bin/$b; done
mpi=$(ldd "$(ldd build/pith | awk '/libmpi\.so/ {print $3}')" | awk '{print $1}')
skip='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libgcc_s\.|libstdc\+\+|libcudart|libcublas|libnccl|libcudnn|libmpi)'
for b in pith test_gpu; do ldd build/$b; done | awk '$2 == "=>" {print $1, $3}' | sort -u | while read -r name path; do
    [[ $name =~ $skip ]] && continue
    grep -qx "$name" <<<"$mpi" && continue
    gzip -9 -c "$path" >$D/lib/$name.gz
done
cp -r bench/results/2026-12-01-h200-r4/run.sh bench/peer_grouped.py bench/qwen3_30b_a3b_8l bench/deepseek_v2_lite_8l $D/
du -sh $D
