#!/usr/bin/env bash
# simulate.sh — scripts/launch.sh's SLURM branch on a machine without SLURM: the allocation's variables set by hand
# and an `srun` stand-in on PATH that checks the arguments launch.sh gives it and runs the ranks under mpirun on
# CPU ranks of this machine. Two allocations: 1 node × 2 tasks, and 2 "nodes" × 1 task (both ranks run here).
# Each runs examples/tiny for 6 steps at ep2 and must give the one-process run's losses and gradient norms
# (compare.py, rel 1e-5). Prints PASS or FAIL per allocation and "launch-on-slurm (simulated): PASS|FAIL" last.
#   bash .agents/skills/launch-on-slurm/simulate.sh        (from the repository root, build/pith built)
set -euo pipefail
top=$(git rev-parse --show-toplevel)
cd "$top"
compare=$top/.agents/skills/validate-correctness/compare.py
work=${WORK:-/tmp/pith-slurm-sim-$$}
mkdir -p "$work/bin" "$work/data"
build/pith synth --output "$work/data/tokens.bin" --vocab 256 --tokens 200000 --seed 1 >/dev/null
sets=(--set dataset="$work/data" --set max_steps=6 --set tensorboard=false --set device=cpu)

# The srun stand-in: records its arguments, checks 1 <= tasks <= nodes × tasks-per-node (srun's rule: with --ntasks,
# --ntasks-per-node is a maximum), runs the tasks under mpirun.
cat >"$work/bin/srun" <<'EOF'
#!/usr/bin/env bash
echo "srun $*" >>"$SIM_LOG"
nodes=1 tasks=1 per=1
while [ $# -gt 0 ]; do
    case "$1" in
    --nodes=*) nodes=${1#*=} ;;
    --ntasks=*) tasks=${1#*=} ;;
    --ntasks-per-node=*) per=${1#*=} ;;
    --mpi=* | --kill-on-bad-exit=*) ;;
    -*) echo "srun stand-in: unexpected option $1" >&2; exit 2 ;;
    *) break ;;
    esac
    shift
done
[ "$tasks" -ge 1 ] && [ "$tasks" -le $((nodes * per)) ] ||
    { echo "srun stand-in: $tasks tasks do not fit $nodes nodes × $per tasks per node" >&2; exit 2; }
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
exec mpirun -np "$tasks" --oversubscribe --bind-to none ${root[@]+"${root[@]}"} -x OMP_NUM_THREADS=1 "$@"
EOF
chmod +x "$work/bin/srun"

build/pith train examples/tiny/train.json "${sets[@]}" --set run_dir="$work/one" >"$work/one.log" 2>&1
ok=1
for alloc in "1 2" "2 1"; do
    read -r nodes per <<<"$alloc"
    name=nodes$nodes-tasks$per
    export SIM_LOG=$work/$name.srun
    : >"$SIM_LOG"
    echo "== SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=$nodes SLURM_NTASKS_PER_NODE=$per scripts/launch.sh (ep2)"
    if ! PATH=$work/bin:$PATH SLURM_JOB_ID=4242 SLURM_JOB_NUM_NODES=$nodes SLURM_NTASKS_PER_NODE=$per \
        bash scripts/launch.sh examples/tiny/train.json "${sets[@]}" --set run_dir="$work/$name" \
        --set parallel.expert_parallel_size=2 >"$work/$name.log" 2>&1; then
        tail -5 "$work/$name.log"
        echo "FAIL: $name did not finish (log: $work/$name.log)"
        ok=0
        continue
    fi
    grep "^launch:" "$work/$name.log"
    cat "$SIM_LOG"
    python3 "$compare" "$work/one/metrics.jsonl" "$work/$name/metrics.jsonl" --tol 1e-5 || ok=0
done
if [ $ok = 1 ]; then echo "launch-on-slurm (simulated): PASS"; else echo "launch-on-slurm (simulated): FAIL"; fi
[ $ok = 1 ]
