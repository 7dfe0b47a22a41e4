#!/usr/bin/env bash
# Call D: the router's own kernel (mqlm) against the build before it (mqlm-prev, 616efe8) on qwen3moe;
# the router rows of bench kernels; speculation with its counters.
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
for bin in mqlm-prev mqlm; do
  MQLM=.devrun/bin/$bin PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
done
grep -v "^wrote" $OUT/quant-types.txt
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
.devrun/bin/mqlm generate /tmp/quant-types/qwen3moe-30b-a3b-q4_k_m.gguf -p "$P" -n 64 --temperature 0 --warmup --profile 2>&1 | grep -v miva | tail -40 > $OUT/profile.txt
head -25 $OUT/profile.txt
.devrun/bin/mqlm bench kernels --experts-only --tokens 512 --types q4_k --out $OUT/kernels.md > /dev/null 2>&1; grep -i "router" $OUT/kernels.md
DRAFTS=4 bash bench/speculation-on-h200.sh > /dev/null 2>&1
grep -E "^== |TPOT|Output token|^mqlm_scheduler" $OUT/speculation.txt | cut -c1-110
