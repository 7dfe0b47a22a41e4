#!/usr/bin/env bash
# Staged matmul experiments, one machine, one call: this build (mqlm) against the one before
# (mqlm-base): the kernel table of the tensor-core products (decode widths and prefill chunks),
# another prefill tile shape, and prefill / batched decode end to end. llama3-8b Q4_0.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/kern.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader; } > $log
B=.devrun/bin
$B/mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
k="bench kernels --preset llama3-8b --types q4_0,f16 --staged-only --target-ms 20"
$B/mqlm $k --tokens 32,512,2048 > /dev/null 2>&1  # warm the machine
for bin in mqlm mqlm-base mqlm mqlm-base; do
  echo "== $bin default" >> $log
  $B/$bin $k --tokens ${TOKENS:-32,512,2048} 2>&1 | grep -E "^\| matmul" >> $log
done
for shape in ${SHAPES:-2x4x4x2x2}; do
  for bin in mqlm mqlm-base; do
    echo "== $bin $shape" >> $log
    $B/$bin $k --tokens 512,2048 --staged-shape $shape 2>&1 | grep -E "^\| matmul|rror" >> $log
  done
done
$B/mqlm $k --tokens 32,512 --pipeline-stats $OUT/stats > /dev/null 2>&1
p=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..13})
for bin in mqlm mqlm-base mqlm mqlm-base; do
  echo "$bin batch 16 x 128-token prompts: $($B/$bin generate /tmp/m.gguf -p "$p" -n 16 --temperature 0 --batch 16 --warmup -q 2>&1 | grep -E 'prefill|decode' | tr '\n' ' ')" >> $log
  echo "$bin batch 32: $($B/$bin generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --batch 32 --warmup -q 2>&1 | grep -E 'prefill|decode' | tr '\n' ' ')" >> $log
done
for bin in mqlm mqlm-base; do
  $B/$bin generate /tmp/m.gguf -p "$p" -n 48 --temperature 0 --batch 32 > $OUT/tokens-b32-$bin.txt 2>/dev/null
done
cmp $OUT/tokens-b32-mqlm.txt $OUT/tokens-b32-mqlm-base.txt >> $log 2>&1 && echo "batch 32 output: identical" >> $log
cat $log
