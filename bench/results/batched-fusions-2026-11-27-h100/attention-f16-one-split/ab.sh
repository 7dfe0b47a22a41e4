#!/usr/bin/env bash
# A/B on one machine: this build (mqlm) against the one before (mqlm-base), llama3-8b Q4_0.
cd "$(dirname "$0")/.."
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
log=$OUT/ab.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $log
mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
p=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..3})
for b in ${BATCHES:-64 48 16}; do
  for bin in mqlm mqlm-base mqlm mqlm-base; do
    echo "batch $b $bin: $(.devrun/bin/$bin generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --batch $b --warmup -q 2>&1 | grep -m1 'decode')" >> $log
  done
done
for bin in mqlm mqlm-base; do
  .devrun/bin/$bin generate /tmp/m.gguf -p "$p" -n 128 --temperature 0 --batch 64 --warmup --profile -q > $OUT/profile-b32-$bin.txt 2>&1
  .devrun/bin/$bin generate /tmp/m.gguf -p "$p" -n 48 --temperature 0 --batch 64 > $OUT/tokens-b32-$bin.txt 2>/dev/null
  .devrun/bin/$bin generate /tmp/m.gguf -p "$p" -n 48 --temperature 0 --batch 16 > $OUT/tokens-b16-$bin.txt 2>/dev/null
done
cmp $OUT/tokens-b32-mqlm.txt $OUT/tokens-b32-mqlm-base.txt >> $log 2>&1 && echo "batch 64 output: identical" >> $log
cmp $OUT/tokens-b16-mqlm.txt $OUT/tokens-b16-mqlm-base.txt >> $log 2>&1 && echo "batch 16 output: identical" >> $log
if [ -x .devrun/bin/mqlm_gpu_tests ]; then
  .devrun/bin/mqlm_gpu_tests --gtest_filter="Attention*:F16Inputs.*:NarrowGlu.*:RopeKvWrite.*:DirectMatmul.*" > $OUT/mqlm_gpu_tests.txt 2>&1; echo "mqlm_gpu_tests rc=$?" >> $log
  tail -3 $OUT/mqlm_gpu_tests.txt >> $log
fi
if [ -x .devrun/bin/llama_gpu_tests ]; then
  (cd /work/main 2>/dev/null || true; .devrun/bin/llama_gpu_tests > $OUT/llama_gpu_tests.txt 2>&1); echo "llama_gpu_tests rc=$?" >> $log
  tail -3 $OUT/llama_gpu_tests.txt >> $log
fi
cat $log
