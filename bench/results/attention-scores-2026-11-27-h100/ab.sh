#!/usr/bin/env bash
# Attention scores with two keys a thread: this build (mqlm) against the one before (mqlm-base),
# one machine, one call, alternated; llama3-8b Q4_0; then the GPU tests.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/ab.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $log
B=.devrun/bin
$B/mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
p130=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..13})
p600=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..60})
p2000=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..200})
for i in 1 2 3; do
  for bin in mqlm mqlm-base; do
    echo "$bin decode 1: $($B/$bin generate /tmp/m.gguf -p "$p600" -n 128 --temperature 0 --warmup -q 2>&1 | grep -E "^decode" | tr "\n" " ")" >> $log
    echo "$bin decode 32: $($B/$bin generate /tmp/m.gguf -p "$p130" -n 128 --temperature 0 --batch 32 --warmup -q 2>&1 | grep -E "^decode" | tr "\n" " ")" >> $log
  done
  for bin in mqlm mqlm-base; do
    echo "$bin 2002: $($B/$bin generate /tmp/m.gguf -p "$p2000" -n 8 --temperature 0 --warmup -q 2>&1 | grep -E '^prefill' | tr '\n' ' ')" >> $log
    echo "$bin 602: $($B/$bin generate /tmp/m.gguf -p "$p600" -n 8 --temperature 0 --warmup -q 2>&1 | grep -E '^prefill' | tr '\n' ' ')" >> $log
    echo "$bin 16x132: $($B/$bin generate /tmp/m.gguf -p "$p130" -n 8 --temperature 0 --batch 16 --warmup -q 2>&1 | grep -E '^prefill' | tr '\n' ' ')" >> $log
  done
done
for bin in mqlm mqlm-base; do
  $B/$bin generate /tmp/m.gguf -p "$p2000" -n 8 --temperature 0 --warmup --profile -q > $OUT/profile-2002-$bin.txt 2>&1
  $B/$bin generate /tmp/m.gguf -p "$p130" -n 128 --temperature 0 --batch 32 --warmup --profile -q > $OUT/profile-b32-$bin.txt 2>&1
  $B/$bin generate /tmp/m.gguf -p "$p600" -n 128 --temperature 0 --warmup --profile -q > $OUT/profile-b1-$bin.txt 2>&1
  $B/$bin generate /tmp/m.gguf -p "$p600" -n 48 --temperature 0 2>/dev/null | head -1 > $OUT/tokens-602-$bin.txt
  $B/$bin generate /tmp/m.gguf -p "$p130" -n 32 --temperature 0 --batch 16 2>/dev/null > $OUT/tokens-b16-$bin.txt
done
cmp $OUT/tokens-602-mqlm.txt $OUT/tokens-602-mqlm-base.txt >> $log 2>&1 && echo "602-token prompt, 48 tokens: identical" >> $log
cmp $OUT/tokens-b16-mqlm.txt $OUT/tokens-b16-mqlm-base.txt >> $log 2>&1 && echo "16 x 132-token prompts, 32 tokens: identical" >> $log
grep -A14 "^prefill (per step)" $OUT/profile-2002-*.txt | grep -E "attention|per step" >> $log
grep -A16 "^decode (per token)" $OUT/profile-b32-*.txt $OUT/profile-b1-*.txt | grep -E "attention|per token" >> $log
$B/mqlm_gpu_tests > $OUT/mqlm_gpu_tests.txt 2>&1; echo "mqlm_gpu_tests rc=$?" >> $log; tail -3 $OUT/mqlm_gpu_tests.txt >> $log
$B/llama_gpu_tests > $OUT/llama_gpu_tests.txt 2>&1; echo "llama_gpu_tests rc=$?" >> $log; tail -3 $OUT/llama_gpu_tests.txt >> $log
cat $log
