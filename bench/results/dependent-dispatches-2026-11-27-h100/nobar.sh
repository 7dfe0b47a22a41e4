#!/usr/bin/env bash
# Upper bound of overlapping each int8 mat-vec with the dispatch before it: the barrier before
# the mat-vecs dropped (MQLM_XP_NOBAR=1; results wrong, timing only), one sequence, Q4_0.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/nobar.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $log
B=.devrun/bin
$B/mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
p=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..13})
for i in 1 2 3; do
  for e in 0 1; do
    if [ $e = 1 ]; then export MQLM_XP_NOBAR=1; else unset MQLM_XP_NOBAR; fi
    echo "nobar=$e: $($B/mqlm generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --warmup -q 2>&1 | grep -E 'decode' | tr '\n' ' ')" >> $log
  done
done
unset MQLM_XP_NOBAR; $B/mqlm generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --warmup --profile -q > $OUT/profile-bar.txt 2>&1
MQLM_XP_NOBAR=1 $B/mqlm generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --warmup --profile -q > $OUT/profile-nobar.txt 2>&1
cat $log
