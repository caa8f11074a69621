#!/usr/bin/env bash
# check.sh — is model family FAMILY (its HF model_type) complete? From the repository root, build/pith and
# build/test_pith built (make -j2 build/pith build/test_pith build/test_parallel).
#   bash .agents/skills/add-model-family/check.sh FAMILY [LAYOUT_TEST]
# Static: the family file and its table entry, no parallel/ include, HF fixtures with their generator entry, an
# example config, a benchmark config, the GPU tests naming it, the docs. Then it runs the CPU tests whose names
# contain FAMILY (at least one gradient check and one HF parity test) and LAYOUT_TEST (default
# dist_equivalence_layouts_FAMILY; the first family's is plain dist_equivalence_layouts), compiles the GPU suite
# where nvcc exists, and plans the example with `pith estimate`. Prints "ok" or "MISSING" per item and
# "add-model-family FAMILY: PASS" or "... FAIL" last; exit status 0 or 1.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
[ $# -ge 1 ] || { sed -n 2,10p "$0" >&2; exit 2; }
f=$1 layout=${2:-dist_equivalence_layouts_$1}
bad=0
item() { # description, then a command that succeeds when the item is there
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then echo "ok       $what"; else echo "MISSING  $what" && bad=1; fi
}
has_type() { grep -q "\"model_type\": *\"$f\"" "$@"; }
fixtures=$(for d in tests/hf/*/; do [ -f "$d/config.json" ] && has_type "$d/config.json" && echo "${d%/}"; done)
fixtures_complete() {
    [ -n "$fixtures" ] || return 1
    for d in $fixtures; do for x in config.json expected.json model.safetensors tokens.bin train.json; do
        [ -s "$d/$x" ] || return 1
    done; done
}
examples=$(grep -l "\"model_type\": *\"$f\"" examples/*/*.json 2>/dev/null | head -1)

item "src/model/$f.c defines ${f}_family with model_type \"$f\"" \
    grep -q "\.model_type = \"$f\"" "src/model/$f.c"
item "src/model/model.c lists &${f}_family in families[]" grep -q "families\[\] = {.*&${f}_family" src/model/model.c
item "src/model/$f.c includes nothing from parallel/ (the engine allocates the stage buffers)" \
    bash -c "test -f src/model/$f.c && ! grep -q '#include \"parallel/' src/model/$f.c"
item "HF fixtures tests/hf/* of model_type $f, each with its five files (${fixtures//$'\n'/ })" fixtures_complete
item "tests/hf/make_fixtures.py makes them" grep -q "$f" tests/hf/make_fixtures.py
gpu_runs_fixtures() { for d in $fixtures; do grep -q "\"$d\"" tests/gpu/test_gpu_hf.c || return 1; done; }
item "tests/gpu/test_gpu_hf.c runs every fixture" gpu_runs_fixtures
item "a GPU model test names $f (tests/gpu/)" grep -q "$f" tests/gpu/*.c tests/gpu/gpu_test.h tests/test.h
item "an example config of model_type $f (examples/)" test -n "$examples"
item "a benchmark config of model_type $f (bench/*/model.json)" bash -c "grep -l '\"model_type\": *\"$f\"' bench/*/model.json"
item "docs/architecture.md names model/$f.c" grep -q "model/$f.c" docs/architecture.md
item "README.md lists model_type: $f" grep -q "model_type: $f" README.md

out=$(build/test_pith "$f" 2>&1)
echo "$out" | grep -E "^(PASS|FAIL)" | sed 's/^/         /'
item "a gradient check of $f passes (model_gradcheck_$f*)" grep -q "^PASS model_gradcheck_$f" <<<"$out"
item "an HF parity test of $f passes (hf_parity_$f*)" grep -q "^PASS hf_parity_$f" <<<"$out"
item "the KV cache of $f matches full forwards (generate_cache_equals_full_forwards_$f)" \
    grep -q "^PASS generate_cache_equals_full_forwards_$f" <<<"$out"
item "every test named *$f* passes" grep -q "^[1-9][0-9]* passed, 0 failed" <<<"$out"
if grep -q "^PASS $layout " <<<"$out"; then lout=$out; else
    lout=$(build/test_pith "$layout" 2>&1)
    echo "$lout" | grep -E "^(PASS|FAIL)" | sed 's/^/         /'
fi
layout_passes() { grep -q "^PASS $layout " <<<"$lout" && grep -q "^[1-9][0-9]* passed, 0 failed" <<<"$lout"; }
item "the layout test $layout passes" layout_passes
if [ -x /usr/local/cuda/bin/nvcc ]; then
    item "the GPU suite compiles (make cuda-check)" make -j2 cuda-check
else
    echo "skipped  the GPU suite compiles (no nvcc here)"
fi
if [ -n "$examples" ]; then
    cfg=$(dirname "$examples")/train.json
    plans() { for n in 1 8 64; do build/pith estimate "$cfg" --gpus $n && return 0; done; return 1; }
    item "pith estimate plans $cfg (on 1, 8 or 64 GPUs, the first its layout divides)" plans
fi
if [ $bad = 0 ]; then echo "add-model-family $f: PASS"; else echo "add-model-family $f: FAIL"; fi
[ $bad = 0 ]
