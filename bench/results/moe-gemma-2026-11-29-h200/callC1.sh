#!/usr/bin/env bash
# Call C1: llama.cpp's build in the background; the files; speculation (none / ngram) on llama3-8b F16.
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
[ -x /tmp/llamacpp/bin/llama-bench ] || { bash .devrun/peer/llamacpp-build.sh > /tmp/llamacpp-build.log 2>&1 & b=$!; }
B=.devrun/bin/mqlm
mkdir -p /tmp/quant-types
for spec in "gemma3-4b q4_k_m" "gemma3-4b q4_0 --pure" "qwen3moe-30b-a3b q4_k_m" "llama3-8b q4_0 --pure"; do
  set -- $spec; f=/tmp/quant-types/$1-$2${3:+-pure}.gguf
  [ -f $f ] || $B make-model --preset $1 --type $2 $3 -o $f 2>&1 | tail -1
done
DRAFTS="4 8" bash bench/speculation-on-h200.sh > /dev/null 2>&1
cat $OUT/speculation.txt | grep -vE '^(ITL|E2E|TTFT)' 
if [ -n "${b:-}" ]; then wait $b; echo "llama.cpp build: $?"; tail -2 /tmp/llamacpp-build.log; fi
