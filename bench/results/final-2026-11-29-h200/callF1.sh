#!/usr/bin/env bash
# Call F1: llama.cpp's CUDA tools built (llamacpp-peer, at nice 19 so that mqlm's host threads come
# first) while the files are made and mqlm runs every one (bench/quant-types-on-h100.sh's mqlm part,
# two rounds): llama3-8b in every llama-quantize mixture and pure Q4_0 / Q8_0, gemma3-4b Q4_K_M and
# pure Q4_0, qwen3moe-30b-a3b Q4_K_M; this session's main (mqlm) and its start (mqlm-base, 07dd48f).
# Call F2 follows on the same machine: llama.cpp on the same files.
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
[ -x /tmp/llamacpp/bin/llama-bench ] || { nice -n 19 bash .devrun/peer/llamacpp-build.sh > /tmp/llamacpp-build.log 2>&1 & }
B=$!
for bin in mqlm mqlm-base; do
  MQLM=.devrun/bin/$bin PRESET=llama3-8b ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
  MQLM=.devrun/bin/$bin PRESET=gemma3-4b TYPES=q4_k_m PURE=q4_0 ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
  MQLM=.devrun/bin/$bin PRESET=qwen3moe-30b-a3b TYPES=q4_k_m PURE= ROUNDS=2 bash bench/quant-types-on-h100.sh mqlm > /dev/null 2>&1
done
wait $B; tail -2 /tmp/llamacpp-build.log; ls /tmp/llamacpp/bin/ | head
cat $OUT/quant-types.txt
