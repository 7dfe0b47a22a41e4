#!/usr/bin/env bash
# Call B: mqlm before (b627645) and after, then llama.cpp, on the same files; profiles.
set -uo pipefail
cd "$(dirname "$0")/.."
source .devrun/env.sh >/dev/null 2>&1 || true
for bin in mqlm-old mqlm; do
  MQLM=.devrun/bin/$bin PRESET=gemma3-4b TYPES=q4_k_m PURE=q4_0 ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
  MQLM=.devrun/bin/$bin PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
  MQLM=.devrun/bin/$bin PRESET=llama3-8b TYPES= PURE=q4_0 ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
done
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
for f in gemma3-4b-q4_k_m qwen3moe-30b-a3b-q4_k_m; do
  echo "== profile $f" >> $OUT/profile.txt
  .devrun/bin/mqlm generate /tmp/quant-types/$f.gguf -p "$P" -n 64 --temperature 0 --warmup --profile 2>&1 | tail -36 >> $OUT/profile.txt
done
PRESET=gemma3-4b TYPES=q4_k_m PURE=q4_0 bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
PRESET=llama3-8b TYPES= PURE=q4_0 bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
cat $OUT/quant-types.txt
