#!/usr/bin/env bash
# run.sh — tokenizer throughput on this machine, in MB/s of UTF-8 document text (tokenizer loading not timed):
#   pith tokenize --workers 1 and --workers $(nproc)   (reads and parses the .jsonl, tokenizes, writes the .bin)
#   HF tokenizers (Rust) through its npm Node bindings, encodeBatch, one thread       (peer_node.mjs hf)
#   transformers.js (@lenml/tokenizers), encode per document, one thread            (peer_node.mjs tjs)
# Corpus: data/bench/kjv.jsonl, the King James Bible (Debian package bible-kjv: `apt-get install bible-kjv`), one
# document per chapter (1189 chapters, 4.3 MB), repeated COPIES times (default 4). Each figure is the best of REPS runs.
# For HF tokenizers' Python bindings (the GPU machine), see peer_hf_tokenizers.py: it reads the same corpus file.
# Usage: bench/tokenize/run.sh        env: TOKS="qwen3 gptoss deepseek_v3" REPS=3 COPIES=4
set -euo pipefail
cd "$(dirname "$0")/../.."
TOKS=${TOKS:-"qwen3 gptoss deepseek_v3"}
REPS=${REPS:-3}
COPIES=${COPIES:-4}
command -v bible >/dev/null || { echo "run.sh: needs the KJV text: apt-get install bible-kjv" >&2; exit 1; }
bash scripts/tokenizers.sh --ref
make -s build/pith
corpus=data/bench/kjv.jsonl
if [ ! -s "$corpus" ]; then
    mkdir -p data/bench
    bible "Genesis 1:1-Revelation 22:21" | node -e '
        const lines = require("fs").readFileSync(0, "utf8").split("\n"), docs = [];
        for (const l of lines) {
            if (/^\S.* \d+$/.test(l)) docs.push(l);          // a chapter heading: "Genesis 1", "1 Kings 3"
            else if (docs.length) docs[docs.length - 1] += "\n" + l;
        }
        let out = "";
        for (let c = 0; c < +process.argv[1]; c++) for (const d of docs) out += JSON.stringify({ text: d.trim() }) + "\n";
        process.stdout.write(out);' "$COPIES" >"$corpus.tmp"
    mv "$corpus.tmp" "$corpus"
fi
echo "corpus: $corpus, $(wc -l <"$corpus") documents, $(du -m "$corpus" | cut -f1) MB; $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for t in $TOKS; do
    for w in 1 "$(nproc)"; do
        best=0
        for _ in $(seq "$REPS"); do
            rm -rf "$tmp/out"
            line=$(build/pith tokenize --tokenizer "data/tokenizers/$t" --input "$corpus" --output "$tmp/out" --workers "$w")
            mbs=$(sed -n 's/.*(\([0-9.]*\) MB\/s.*/\1/p' <<<"$line")
            best=$(awk -v a="$best" -v b="$mbs" 'BEGIN { print (b > a ? b : a) }')
        done
        echo "pith tokenize $t workers=$w: $best MB/s  ($line)"
    done
    # the HF run also checks that pith's last output holds exactly HF's ids
    TOKENIZERS_PARALLELISM=false node bench/tokenize/peer_node.mjs "data/tokenizers/$t" "$corpus" hf --reps "$REPS" --check "$tmp/out/kjv.jsonl.bin"
    node bench/tokenize/peer_node.mjs "data/tokenizers/$t" "$corpus" tjs
done
