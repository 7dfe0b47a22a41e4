#!/usr/bin/env bash
# Call F2a: llama.cpp's CUDA tools built (F1's background build left nothing), then llama.cpp
# (`llama-bench -p 512 -n 128 -fa 1 -r 3`) on F1's llama3-8b and gemma3-4b files.
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
[ -x /tmp/llamacpp/bin/llama-bench ] || bash .devrun/peer/llamacpp-build.sh > /tmp/llamacpp-build.log 2>&1
tail -2 /tmp/llamacpp-build.log
PRESET=llama3-8b bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
PRESET=gemma3-4b TYPES=q4_k_m PURE=q4_0 bash bench/quant-types-on-h100.sh llamacpp > /dev/null 2>&1
cat $OUT/quant-types.txt
