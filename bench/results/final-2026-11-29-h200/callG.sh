#!/usr/bin/env bash
# Call G: the session's final main against llama.cpp CUDA on a quiet machine, one call: llama.cpp
# built first (the files made meanwhile), then nothing but the measurements: mqlm (two rounds of
# bench/quant-types-on-h100.sh's mqlm part) and llama-bench on llama3-8b IQ4_XS, Q4_K_M, pure Q4_0
# and Q8_0, gemma3-4b Q4_K_M and qwen3moe-30b-a3b Q4_K_M.
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
M=/tmp/quant-types; mkdir -p $M
(
  mk() { [ -f $M/$1.gguf ] || .devrun/bin/mqlm make-model --preset $2 --type $3 ${4:-} -o $M/$1.gguf > /dev/null; }
  mk llama3-8b-iq4_xs llama3-8b iq4_xs; mk llama3-8b-q4_k_m llama3-8b q4_k_m
  mk llama3-8b-q4_0-pure llama3-8b q4_0 --pure; mk llama3-8b-q8_0-pure llama3-8b q8_0 --pure
  mk gemma3-4b-q4_k_m gemma3-4b q4_k_m; mk qwen3moe-30b-a3b-q4_k_m qwen3moe-30b-a3b q4_k_m
) &
bash .devrun/peer/llamacpp-build.sh > /tmp/llamacpp-build.log 2>&1
wait
ls /tmp/llamacpp/bin/llama-bench $M
for part in mqlm llamacpp; do
  PRESET=llama3-8b TYPES="iq4_xs q4_k_m" PURE="q4_0 q8_0" ROUNDS=2 bash bench/quant-types-on-h100.sh $part > /dev/null 2>&1
  PRESET=gemma3-4b TYPES=q4_k_m PURE= ROUNDS=2 bash bench/quant-types-on-h100.sh $part > /dev/null 2>&1
  PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= ROUNDS=2 bash bench/quant-types-on-h100.sh $part > /dev/null 2>&1
done
cat $OUT/quant-types.txt
