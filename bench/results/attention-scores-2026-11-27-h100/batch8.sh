#!/usr/bin/env bash
# Decode batches of 8 (and 4), this build against the one before, alternated; Q4_0.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
B=.devrun/bin
$B/mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
p130=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..13})
for i in 1 2; do for b in 8 4; do for bin in mqlm mqlm-base; do
  echo "$bin batch $b: $($B/$bin generate /tmp/m.gguf -p "$p130" -n 128 --temperature 0 --batch $b --warmup -q 2>&1 | grep -E '^decode' | tr '\n' ' ')"
done; done; done | tee $OUT/b8.txt
