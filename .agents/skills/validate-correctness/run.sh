#!/usr/bin/env bash
# run.sh — base against feature on the same short CPU training; then the feature's layouts against its one process.
#   bash .agents/skills/validate-correctness/run.sh BASE FEATURE [--steps N] [--tol T] [--layout-tol T] [--no-layouts]
# BASE and FEATURE are git refs (each gets a detached worktree under $WORK and a CPU-only build of build/pith) or
# folders that already hold a built build/pith (e.g. "." for this checkout as it is, uncommitted changes included).
# Both run the tiny example (examples/tiny of BASE, copied once) on the same synthetic tokens, with seed 1234, a
# constant learning rate of 1e-3 (AdamW), no TensorBoard, on the CPU, for N steps (default 25); compare.py then
# compares loss, lb_loss and grad_norm step by step (relative tolerance T, default 1e-4: fp32 CPU code that only
# reorders sums stays far below it; a changed formula does not). With layouts (the default) the feature also runs
# ep2 and dp2 on 2 CPU ranks (scripts/launch.sh) against its one-process run (tolerance 1e-5). Prints PASS or FAIL
# per comparison and a last line "validate-correctness: PASS" or "validate-correctness: FAIL"; exit status 0 or 1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(git rev-parse --show-toplevel)
steps=25 tol=1e-4 ltol=1e-5 layouts=1 refs=()
while [ $# -gt 0 ]; do
    case "$1" in
    --steps) steps=$2 && shift 2 ;;
    --tol) tol=$2 && shift 2 ;;
    --layout-tol) ltol=$2 && shift 2 ;;
    --no-layouts) layouts=0 && shift ;;
    *) refs+=("$1") && shift ;;
    esac
done
[ ${#refs[@]} = 2 ] || { sed -n 2,11p "$0" >&2; exit 2; }
work=${WORK:-/tmp/pith-validate-$$}
mkdir -p "$work"
echo "validate-correctness: work folder $work"
made=() # worktrees this run added; removed at exit (the logs and runs stay in $work)
trap 'for d in ${made[@]+"${made[@]}"}; do git -C "$top" worktree remove --force "$d"; done' EXIT

# A checkout with build/pith for a ref or folder; prints its path.
checkout() {
    local ref=$1 side=$2
    if [ -d "$ref" ] && [ -x "$ref/build/pith" ]; then
        (cd "$ref" && pwd)
        return
    fi
    local dir=$work/$side
    git -C "$top" worktree add --detach "$dir" "$ref" >&2
    echo "validate-correctness: building $side ($ref = $(git -C "$dir" rev-parse --short HEAD))" >&2
    make -C "$dir" -j2 CPU_ONLY=1 build/pith >"$work/build-$side.txt" 2>&1 || {
        tail -20 "$work/build-$side.txt" >&2
        exit 1
    }
    echo "$dir"
}
base=$(checkout "${refs[0]}" base)
[ -d "${refs[0]}" ] || made+=("$base")
feature=$(checkout "${refs[1]}" feature)
[ -d "${refs[1]}" ] || made+=("$feature")

mkdir -p "$work/config" "$work/data"
cp "$base/examples/tiny/train.json" "$base/examples/tiny/model.json" "$work/config/"
"$base/build/pith" synth --output "$work/data/tokens.bin" --vocab 256 --tokens 200000 --seed 1 >/dev/null
sets=(--set dataset="$work/data" --set seed=1234 --set max_steps="$steps" --set device=cpu --set tensorboard=false
      --set 'scheduler={"type": "constant"}' --set optimizer.type=adamw --set optimizer.lr=1e-3)

train() { # run-name checkout ranks [pith train args...]
    local name=$1 dir=$2 np=$3
    shift 3
    rm -rf "$work/runs/$name"
    if ! PITH="$dir/build/pith" bash "$dir/scripts/launch.sh" -n "$np" "$work/config/train.json" "${sets[@]}" \
        --set run_dir="$work/runs/$name" "$@" >"$work/$name.log" 2>&1; then
        tail -5 "$work/$name.log"
        echo "FAIL: the $name run stopped (log: $work/$name.log)"
        return 1
    fi
}

ok=1
train base "$base" 1 && train feature "$feature" 1 || ok=0
if [ $ok = 1 ]; then
    echo "== base ($base) against feature ($feature): $steps steps, tolerance $tol"
    python3 "$here/compare.py" "$work/runs/base/metrics.jsonl" "$work/runs/feature/metrics.jsonl" --tol "$tol" || ok=0
fi
if [ $layouts = 1 ] && [ -s "$work/runs/feature/metrics.jsonl" ]; then
    for layout in ep2 dp2; do
        extra=()
        [ $layout = ep2 ] && extra=(--set parallel.expert_parallel_size=2)
        train "feature-$layout" "$feature" 2 ${extra[@]+"${extra[@]}"} || { ok=0; continue; }
        echo "== feature one process against feature $layout (2 CPU ranks): tolerance $ltol"
        python3 "$here/compare.py" "$work/runs/feature/metrics.jsonl" "$work/runs/feature-$layout/metrics.jsonl" \
            --tol "$ltol" || ok=0
    done
fi
if [ $ok = 1 ]; then echo "validate-correctness: PASS"; else echo "validate-correctness: FAIL"; fi
[ $ok = 1 ]
