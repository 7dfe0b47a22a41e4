#!/usr/bin/env bash
# Call 2: the block-a-thread types' decode workgroups sized to K (b2) against ee455eb (b0), the same
# files, rounds alternated: llama3-8b IQ4_XS and Q4_K_M, gemma3-4b and qwen3moe-30b-a3b Q4_K_M.
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/gen.txt
M=/tmp/m; mkdir -p $M
make() { [ -f $M/$1-$2.gguf ] || .devrun/bin/mqlm-b0 make-model --preset $1 --type $2 -o $M/$1-$2.gguf >> $OUT/gen.txt; }
make llama3-8b iq4_xs; make llama3-8b q4_k_m; make gemma3-4b q4_k_m; make qwen3moe-30b-a3b q4_k_m
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
run() {
  local bin=$1 f=$2; shift 2
  local r; r=$(.devrun/bin/$bin generate $M/$f.gguf -p "$P" -n 128 --temperature 0 --warmup -q "$@" 2>&1 | grep -o "decode: .*tokens/s," | tr '\n' ' ')
  echo "$bin $f $* : $r" >> $OUT/gen.txt
}
.devrun/bin/mqlm-b0 generate $M/llama3-8b-iq4_xs.gguf -p "$P" -n 32 --temperature 0 -q > /dev/null 2>&1
for round in 1 2; do
  for bin in mqlm-b0 mqlm-b2; do
    for f in llama3-8b-iq4_xs llama3-8b-q4_k_m gemma3-4b-q4_k_m qwen3moe-30b-a3b-q4_k_m; do run $bin $f; done
  done
done
for f in llama3-8b-iq4_xs qwen3moe-30b-a3b-q4_k_m; do
  echo "== profile mqlm-b2 $f" >> $OUT/profile.txt
  .devrun/bin/mqlm-b2 generate $M/$f.gguf -p "$P" -n 64 --temperature 0 --warmup --profile 2>&1 | sed -n '/decode (per token)/,$p' >> $OUT/profile.txt
done
cat $OUT/gen.txt
