#!/usr/bin/env bash
# Call F2b: the disk holds 64 GiB, so three llama3-8b files go before qwen3moe-30b-a3b Q4_K_M (18.6
# GB) is made; mqlm, mqlm-base and llama.cpp on it, then extra.sh (the helpers' A/B runs) and profiles.
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
rm -f /tmp/quant-types/llama3-8b-q8_0.gguf /tmp/quant-types/llama3-8b-q6_k.gguf /tmp/quant-types/llama3-8b-q5_k_m.gguf
for bin in mqlm mqlm-base; do
  MQLM=.devrun/bin/$bin PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
done
PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
echo "== profile qwen3moe-30b-a3b-q4_k_m" >> $OUT/profile.txt
.devrun/bin/mqlm generate /tmp/quant-types/qwen3moe-30b-a3b-q4_k_m.gguf -p "$P" -n 64 --temperature 0 --warmup --profile 2>&1 | tail -40 >> $OUT/profile.txt
bash bench/results/final-2026-11-29-h200/extra.sh
cat $OUT/quant-types.txt
