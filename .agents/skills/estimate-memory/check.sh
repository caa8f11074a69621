#!/usr/bin/env bash
# check.sh — a memory estimate and its two checks, from the repository root with build/pith built.
#   bash .agents/skills/estimate-memory/check.sh CONFIG --gpus N [--gpu-memory GB] [--set key=value ...]
#       `pith estimate` for CONFIG on N GPUs; PASS when the estimator's verdict is OK or TIGHT (the plan and the
#       runtime outside it fit in GB, default 80, per GPU), FAIL when it is OOM, even where the plan alone fits.
#   bash .agents/skills/estimate-memory/check.sh --verify CONFIG --gpus N [--set key=value ...]
#       the estimate against what `pith train` allocates: N CPU ranks (`--device cpu`) run one step under
#       mpirun (scripts/launch.sh) and print their plan; PASS when both totals are the same number of bytes.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
verify=0
if [ "${1:-}" = --verify ]; then verify=1 && shift; fi
[ $# -ge 3 ] || { sed -n 2,7p "$0" >&2; exit 2; }
config=$1
shift
if [ $verify = 0 ]; then
    out=$(build/pith estimate "$config" "$@") || { echo "$out"; echo "estimate-memory: FAIL (pith estimate stopped)"; exit 1; }
    echo "$out"
    verdict=$(sed -n 's/^verdict: \(OK\|TIGHT\|OOM\) on .*/\1/p' <<<"$out" | tail -1)
    case "$verdict" in
    OK | TIGHT) echo "estimate-memory: PASS ($verdict)" ;;
    OOM) echo "estimate-memory: FAIL (OOM)" && exit 1 ;;
    *) echo "estimate-memory: FAIL (no verdict: a GPU plan ends with OK, TIGHT or OOM)" && exit 1 ;;
    esac
    exit
fi
args=("$@") np="" sets=()
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
    --gpus) np=${args[i + 1]} && i=$((i + 1)) ;;
    --set) sets+=(--set "${args[i + 1]}") && i=$((i + 1)) ;;
    esac
done
[ -n "$np" ] || { echo "check.sh --verify: --gpus N is the number of CPU ranks" >&2; exit 2; }
est=$(build/pith estimate "$config" --gpus "$np" --device cpu ${sets[@]+"${sets[@]}"})
echo "$est"
run=/tmp/pith-estimate-verify-$$
out=$(bash scripts/launch.sh -n "$np" "$config" --set device=cpu --set max_steps=1 --set tensorboard=false \
    --set run_dir="$run" ${sets[@]+"${sets[@]}"} 2>&1) || { echo "$out" | tail -5; echo "estimate-memory: FAIL (the run stopped)"; exit 1; }
rm -rf "$run"
plan=$(grep "^plan" <<<"$out")
echo "$plan"
a=$(sed -n 's/.*total .*(\([0-9]*\) bytes).*/\1/p' <<<"$est")
b=$(sed -n 's/.*total .*(\([0-9]*\) bytes).*/\1/p' <<<"$plan")
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "estimate-memory: PASS (estimate = training plan = $a bytes per rank)"
else
    echo "estimate-memory: FAIL (estimate ${a:-?} bytes, training plan ${b:-?} bytes)"
    exit 1
fi
