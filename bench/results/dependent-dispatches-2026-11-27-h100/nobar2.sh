#!/usr/bin/env bash
# Upper bound of overlapping each tensor-core product with the dispatch before it at 16 / 32
# sequences: the barrier before them dropped (MQLM_XP_NOBAR2=1; results wrong, timing only), Q4_0.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/nobar2.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $log
B=.devrun/bin
$B/mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
p=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..13})
for b in 32 16; do
for i in 1 2; do
  for e in 0 1; do
    if [ $e = 1 ]; then export MQLM_XP_NOBAR2=1; else unset MQLM_XP_NOBAR2; fi
    echo "batch $b nobar2=$e: $($B/mqlm generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --batch $b --warmup -q 2>&1 | grep -E 'decode' | tr '\n' ' ')" >> $log
  done
done
done
cat $log
