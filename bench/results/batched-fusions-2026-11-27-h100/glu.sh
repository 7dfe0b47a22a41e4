#!/usr/bin/env bash
cd "$(dirname "$0")/.."
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
log=$OUT/glu.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $log
mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
p=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..3})
for b in 32 24 20; do
  for bin in mqlm mqlm-glu32 mqlm mqlm-glu32; do
    echo "batch $b $bin: $(.devrun/bin/$bin generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --batch $b --warmup -q 2>&1 | grep -m1 'decode')" >> $log
  done
done
for bin in mqlm mqlm-glu32; do
  .devrun/bin/$bin generate /tmp/m.gguf -p "$p" -n 48 --temperature 0 --batch 32 2>/dev/null | md5sum >> $log
done
cat $log
