#!/usr/bin/env bash
# check.sh — is model family FAMILY (its HF model_type) complete? From the repository root, build/pith and
# build/test_pith built (make -j2 build/pith build/test_pith build/test_parallel).
#   bash .agents/skills/add-model-family/check.sh [--quick] FAMILY [LAYOUT_TEST]
# The family file is the src/model/*.c whose ModelFamily has model_type FAMILY; its name NAME (qwen3_5_moe for
# qwen3_5_moe_text) names the tests, docs and GPU tests. Static: the family file and its table entry, no parallel/
# include, HF fixtures with their generator entry (a parity fixture: config.json, expected.json, model.safetensors,
# tokens.bin, train.json; an import fixture such as gpt_oss_mxfp4: config.json, model.safetensors, tokens.bin and an
# expected.json of its own or in <fixture>_ref/), an example config, a benchmark config, the GPU tests naming it, the
# docs. Then it runs the CPU tests whose names contain NAME (at least one gradient check, one HF parity test, the KV
# cache test) and LAYOUT_TEST (default dist_equivalence_layouts_NAME; the first family of families[] has the plain
# dist_equivalence_layouts), compiles the GPU suite where nvcc exists, and plans the example with `pith estimate`.
# --quick (what `make test` runs, seconds a family): the same static items; the named tests must exist in tests/*.c
# (the suite runs them itself) and only hf_parity_NAME runs; no GPU compile.
# Prints "ok" or "MISSING" per item and "add-model-family FAMILY: PASS" or "... FAIL" last; exit status 0 or 1.
set -uo pipefail
cd "$(git rev-parse --show-toplevel)"
quick=0
if [ "${1:-}" = --quick ]; then quick=1 && shift; fi
[ $# -ge 1 ] || { sed -n 2,16p "$0" >&2; exit 2; }
f=$1
bad=0
item() { # description, then a command that succeeds when the item is there
    local what=$1
    shift
    if "$@" >/dev/null 2>&1; then echo "ok       $what"; else echo "MISSING  $what" && bad=1; fi
}
src=$(grep -l "^ *\.model_type = \"$f\"," src/model/*.c | head -1)
name=$(basename "${src:-src/model/$f.c}" .c)
fam=$([ -n "$src" ] && grep -B4 "^ *\.model_type = \"$f\"," "$src" | sed -n 's/^const ModelFamily \([a-z0-9_]*\) = {.*/\1/p')
table=$(sed -n '/families\[\] = {/,/};/p' src/model/model.c)
first=$(grep -o '&[a-z0-9_]*' <<<"$table" | head -1)
if [ $# -ge 2 ]; then layout=$2; elif [ "&$fam" = "$first" ]; then layout=dist_equivalence_layouts; else
    layout=dist_equivalence_layouts_$name
fi
has_type() { grep -q "\"model_type\": *\"$f\"" "$@"; }
fixtures=$(for d in tests/hf/*/; do [ -f "$d/config.json" ] && has_type "$d/config.json" && echo "${d%/}"; done)
fixtures_complete() { # at least one parity fixture; every fixture complete for its kind
    local parity=0 d x
    for d in $fixtures; do
        if [ -e "$d/train.json" ]; then
            parity=1
            for x in config.json expected.json model.safetensors tokens.bin train.json; do [ -s "$d/$x" ] || return 1; done
        else
            for x in config.json model.safetensors tokens.bin; do [ -s "$d/$x" ] || return 1; done
            [ -s "$d/expected.json" ] || [ -s "${d}_ref/expected.json" ] || return 1
        fi
    done
    [ $parity = 1 ]
}
made_by_generator() { for d in $fixtures; do grep -q "\"$(basename "$d")\"" tests/hf/make_fixtures.py || return 1; done; }
gpu_runs_fixtures() { for d in $fixtures; do grep -q "\"$d\"" tests/gpu/*.c || return 1; done; }
examples=$(grep -l "\"model_type\": *\"$f\"" examples/*/*.json 2>/dev/null | head -1)

item "src/model/$name.c defines a ModelFamily with model_type \"$f\" (${fam:-none})" test -n "$fam"
item "src/model/model.c lists &${fam:-?} in families[]" grep -q "&$fam\b" <<<"$table"
item "src/model/$name.c includes nothing from parallel/ (the engine allocates the stage buffers)" \
    bash -c "test -f src/model/$name.c && ! grep -q '#include \"parallel/' src/model/$name.c"
item "HF fixtures tests/hf/* of model_type $f, each complete (${fixtures//$'\n'/ })" fixtures_complete
item "tests/hf/make_fixtures.py makes each of them" made_by_generator
item "a GPU test runs every fixture (tests/gpu/*.c)" gpu_runs_fixtures
item "a GPU model test names $name (tests/gpu/)" grep -q "$name" tests/gpu/*.c tests/gpu/gpu_test.h tests/test.h
item "an example config of model_type $f (examples/)" test -n "$examples"
item "a benchmark config of model_type $f (bench/*/model.json)" bash -c "grep -l '\"model_type\": *\"$f\"' bench/*/model.json"
item "docs/architecture.md names model/$name.c" grep -q "model/$name.c" docs/architecture.md
item "docs/usage.md lists model_type: $f" grep -q "model_type: $f" docs/usage.md

if [ $quick = 1 ]; then
    defined() { grep -q "^TEST($1" tests/*.c; }
    item "a gradient check of $name exists (TEST(model_gradcheck_$name*))" defined "model_gradcheck_$name"
    item "an HF parity test of $name exists (TEST(hf_parity_$name*))" defined "hf_parity_$name"
    item "the KV cache test of $name exists (TEST(generate_cache_equals_full_forwards_$name*))" \
        defined "generate_cache_equals_full_forwards_$name"
    item "the layout test $layout exists" defined "$layout)"
    out=$(build/test_pith "hf_parity_$name" 2>&1)
    echo "$out" | grep -E "^(PASS|FAIL)" | sed 's/^/         /'
    item "the HF parity tests of $name pass (hf_parity_$name*)" grep -q "^[1-9][0-9]* passed, 0 failed" <<<"$out"
else
    out=$(build/test_pith "$name" 2>&1)
    echo "$out" | grep -E "^(PASS|FAIL)" | sed 's/^/         /'
    item "a gradient check of $name passes (model_gradcheck_$name*)" grep -q "^PASS model_gradcheck_$name" <<<"$out"
    item "an HF parity test of $name passes (hf_parity_$name*)" grep -q "^PASS hf_parity_$name" <<<"$out"
    item "the KV cache of $name matches full forwards (generate_cache_equals_full_forwards_$name)" \
        grep -q "^PASS generate_cache_equals_full_forwards_$name" <<<"$out"
    item "every test named *$name* passes" grep -q "^[1-9][0-9]* passed, 0 failed" <<<"$out"
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
fi
if [ -n "$examples" ]; then
    cfg=$(dirname "$examples")/train.json
    plans() { for n in 1 8 64; do build/pith estimate "$cfg" --gpus $n && return 0; done; return 1; }
    item "pith estimate plans $cfg (on 1, 8 or 64 GPUs, the first its layout divides)" plans
fi
if [ $bad = 0 ]; then echo "add-model-family $f: PASS"; else echo "add-model-family $f: FAIL"; fi
[ $bad = 0 ]
