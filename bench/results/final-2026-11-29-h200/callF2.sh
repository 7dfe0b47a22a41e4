#!/usr/bin/env bash
# Call F2: llama.cpp CUDA (`llama-bench -p 512 -n 128 -fa 1 -r 3`) on F1's files, then profiles and
# $EXTRA (the helpers' A/B runs).
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
PRESET=llama3-8b bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
PRESET=gemma3-4b TYPES=q4_k_m PURE=q4_0 bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
for f in qwen3moe-30b-a3b-q4_k_m llama3-8b-q4_0-pure; do
  echo "== profile $f" >> $OUT/profile.txt
  .devrun/bin/mqlm generate /tmp/quant-types/$f.gguf -p "$P" -n 64 --temperature 0 --warmup --profile 2>&1 | tail -40 >> $OUT/profile.txt
done
[ -n "${EXTRA:-}" ] && bash $EXTRA
cat $OUT/quant-types.txt
