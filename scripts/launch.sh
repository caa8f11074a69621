#!/usr/bin/env bash
# launch.sh — starts `pith train` on every rank:  scripts/launch.sh [-n RANKS] CONFIG [pith train args]
#   In a SLURM allocation (SLURM_JOB_ID set): srun, one rank per GPU on every node (RANKS in all with -n).
#   Else on this machine: one rank per GPU (nvidia-smi -L), or RANKS CPU ranks (-n; default 1). One rank
#   runs pith directly (no launcher); several run under mpirun, with --oversubscribe when there are more
#   ranks than cores, OpenMP threads shared out between the ranks, and Open MPI's root permission when
#   run as root. PITH=/path/to/pith overrides the binary; SRUN_MPI (default pmix) is srun's --mpi plugin.
#   The layout comes from the config (--set parallel.pipeline_parallel_size=P, ...expert_parallel_size=E):
#   ranks = pp × dp × ep, pp outermost, so a pipeline stage is dp·ep consecutive ranks (one node's GPUs
#   when it fits) and its pipeline messages cross stages.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pith=${PITH:-$root/build/pith}
n=""
if [ "${1:-}" = "-n" ]; then
    [ $# -ge 2 ] && [ "$2" -ge 1 ] 2>/dev/null || { echo "launch.sh: -n needs a positive rank count" >&2; exit 2; }
    n=$2
    shift 2
fi
[ $# -ge 1 ] || { echo "usage: scripts/launch.sh [-n RANKS] CONFIG [pith train args]" >&2; exit 2; }
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi

if [ -n "${SLURM_JOB_ID:-}" ]; then
    nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    per=$((gpus > 0 ? gpus : ${SLURM_NTASKS_PER_NODE:-1}))
    total=${n:-$((per * nodes))}
    echo "launch: srun, $nodes node(s), $total rank(s), $gpus GPU(s) per node" >&2
    exec srun --nodes="$nodes" --ntasks="$total" --ntasks-per-node="$per" --mpi="${SRUN_MPI:-pmix}" --kill-on-bad-exit=1 "$pith" train "$@"
fi

np=${n:-$((gpus > 0 ? gpus : 1))}
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) # (nproc itself answers OMP_NUM_THREADS when set)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$((cores / np > 0 ? cores / np : 1))}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}
if [ "$np" -eq 1 ]; then exec "$pith" train "$@"; fi
extra=()
if [ "$np" -gt "$cores" ]; then extra+=(--oversubscribe); fi
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
echo "launch: mpirun, $np rank(s) on $cores core(s), $gpus GPU(s), $OMP_NUM_THREADS thread(s) per rank" >&2
exec mpirun -np "$np" --bind-to none ${extra[@]+"${extra[@]}"} -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS "$pith" train "$@"
