#!/usr/bin/env bash
# Overlap variants (no coherent activation loads; a: 4 units of weights loaded before the wait,
# b: 1) on and off, against the build before (base); one sequence, Q4_0.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/overlap2.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $log
B=.devrun/bin
p=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..13})
$B/mqlm-c make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
for i in 1 2 3; do
  for v in base b-0 c-1 d-1; do
    bin=mqlm-${v%-*}; ov=${v#*-}; [ $v = base ] && ov=1
    echo "$v: $(MQLM_OVERLAP=$ov $B/$bin generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --warmup -q 2>&1 | grep -E 'decode' | tr '\n' ' ')" >> $log
  done
done
for v in base c-1 d-1; do
  bin=mqlm-${v%-*}
  $B/$bin generate /tmp/m.gguf -p "$p" -n 64 --temperature 0 2>/dev/null | head -1 > /tmp/t-$v.txt
done
cmp /tmp/t-base.txt /tmp/t-c-1.txt && echo "c tokens = base" >> $log
cmp /tmp/t-base.txt /tmp/t-d-1.txt && echo "d tokens = base" >> $log
cat $log
