#!/usr/bin/env bash
# Decode's int8 mat-vecs started alongside the dispatch that quantizes their input (MQLM_OVERLAP):
# one binary on and off, and the build before (mqlm-base), one sequence, Q4_0 and Q8_0; the tokens
# of each compared; the GPU tests.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/overlap.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $log
B=.devrun/bin
p=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..13})
for type in q4_0 q8_0; do
  $B/mqlm make-model --preset llama3-8b --type $type -o /tmp/m.gguf > /dev/null
  for i in 1 2 3; do
    for v in on off base; do
      bin=mqlm; [ $v = base ] && bin=mqlm-base
      ov=1; [ $v = off ] && ov=0
      echo "$type $v: $(MQLM_OVERLAP=$ov $B/$bin generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --warmup -q 2>&1 | grep -E 'decode' | tr '\n' ' ')" >> $log
    done
  done
  for v in on off base; do
    bin=mqlm; [ $v = base ] && bin=mqlm-base
    ov=1; [ $v = off ] && ov=0
    MQLM_OVERLAP=$ov $B/$bin generate /tmp/m.gguf -p "$p" -n 64 --temperature 0 2>/dev/null | head -1 > $OUT/tokens-$type-$v.txt
    MQLM_OVERLAP=$ov $B/$bin generate /tmp/m.gguf -p "$p" -n 64 --temperature 0 --batch 4 2>/dev/null > $OUT/tokens-b4-$type-$v.txt
  done
  for v in off base; do
    cmp $OUT/tokens-$type-on.txt $OUT/tokens-$type-$v.txt >> $log 2>&1 && echo "$type tokens on = $v" >> $log
    cmp $OUT/tokens-b4-$type-on.txt $OUT/tokens-b4-$type-$v.txt >> $log 2>&1 && echo "$type batch 4 tokens on = $v" >> $log
  done
done
if [ -x $B/mqlm_gpu_tests ]; then
  $B/mqlm_gpu_tests > $OUT/mqlm_gpu_tests.txt 2>&1; echo "mqlm_gpu_tests rc=$?" >> $log; tail -3 $OUT/mqlm_gpu_tests.txt >> $log
fi
if [ -x $B/llama_gpu_tests ]; then
  $B/llama_gpu_tests > $OUT/llama_gpu_tests.txt 2>&1; echo "llama_gpu_tests rc=$?" >> $log; tail -3 $OUT/llama_gpu_tests.txt >> $log
fi
cat $log
