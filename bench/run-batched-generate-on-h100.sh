#!/usr/bin/env bash
# Batched greedy decoding of the llama3-8b preset with the GPU profile of a step: where a batch of
# 1, 8, 32 and 64 sequences spends its time (`mqlm generate --batch --profile`).
# Here: cmake --build build && rm -rf .devrun && ../shared/tools/devpack -o .devrun build/mqlm && strip .devrun/bin/*
# There (carry .devrun): bench/run-batched-generate-on-h100.sh   (writes $OUT/batched-generate.txt)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
log=$OUT/batched-generate.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$log"
mqlm make-model --preset llama3-8b --type "${TYPE:-q4_0}" --pure -o /tmp/m.gguf >>"$log"
prompt="In a quiet village by the sea there lived an old fisherman who every morning walked down to the harbour"
for b in ${BATCHES:-1 8 32 64}; do
  cmd="mqlm generate /tmp/m.gguf -p \"\$prompt\" -n ${TOKENS:-128} --temperature 0 --batch $b --warmup --profile -q"
  echo "command: $cmd" >>"$log"
  eval "$cmd" >>"$log" 2>&1 || echo "batch $b failed" >>"$log"
done
cat "$log"
