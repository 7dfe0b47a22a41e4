#!/usr/bin/env bash
# The helpers' A/B runs of call F2 (after llama.cpp): the wide experts' F16 path in the model and its
# tests on the tensor cores; qwen3moe's fused decode experts against the four dispatches; a decode
# batch of 8.
set -uo pipefail
M=/tmp/quant-types
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
for t in .devrun/bin/*_tests; do
  [ -x "$t" ] && "$t" --gtest_filter='NarrowExperts*:GpuModelExperts*:*Experts*F16*' > $OUT/$(basename $t).txt 2>&1
  [ -x "$t" ] && tail -3 $OUT/$(basename $t).txt
done
for round in 1 2; do
  for m in never always; do
    r=$(.devrun/bin/mqlm generate $M/qwen3moe-30b-a3b-q4_k_m.gguf -p "$P" -n 64 --temperature 0 --warmup -q --experts-f16 $m 2>&1 | grep -E "^(prefill|decode)" | tr '\n' ' ')
    echo "experts-f16 $m | $r" >> $OUT/extra.txt
  done
done
for round in 1 2; do
  for sep in "" --experts-separate; do
    r=$(.devrun/bin/mqlm generate $M/qwen3moe-30b-a3b-q4_k_m.gguf -p "$P" -n 128 --temperature 0 --warmup -q $sep 2>&1 | grep -E "^decode" | tr '\n' ' ')
    echo "decode ${sep:-fused} | $r" >> $OUT/extra.txt
  done
done
.devrun/bin/mqlm bench kernels --experts-only --tokens 1 --types q4_k,q6_k --out $OUT/kernels-experts-1.md > /dev/null 2>&1
echo "== profile experts-f16 always" >> $OUT/profile.txt
.devrun/bin/mqlm generate $M/qwen3moe-30b-a3b-q4_k_m.gguf -p "$P" -n 16 --temperature 0 --warmup --profile --experts-f16 always 2>&1 | sed -n '/prefill (per step)/,/decode (per token)/p' >> $OUT/profile.txt
for bin in mqlm mqlm-base; do
  r=$(.devrun/bin/$bin generate $M/llama3-8b-q4_0-pure.gguf -p "$P" -n 128 --temperature 0 --warmup -q --batch 8 2>&1 | grep -E "^decode" | tr '\n' ' ')
  echo "$bin batch 8 q4_0 pure | $r" >> $OUT/extra.txt
done
cat $OUT/extra.txt
