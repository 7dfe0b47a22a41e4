#!/usr/bin/env bash
# `mqlm generate` on the llama3-8b preset in F16, Q8_0 and Q4_0 on the H100, in one command:
# the copy bandwidth first (the roofline's denominator), then for each type a model made on the
# spot, a 602-token prefill and 128 greedy decode tokens. Writes $OUT/generate-h100.txt.
# Here: cmake --build build && ../shared/tools/devpack -o .devrun build/mqlm && strip .devrun/bin/mqlm
# There (carry .devrun): bench/run-generate-on-h100.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
log=$OUT/generate-h100.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$log"
mqlm bench kernels --tokens 1 --types f16 --matmul-only --out /tmp/k.md >/dev/null 2>&1 && grep -m1 "copy bandwidth" /tmp/k.md >>"$log" || echo "copy bandwidth: not measured" >>"$log"
prompt=$(printf 'The quick brown fox jumps over the lazy dog, and then it runs back home. %.0s' {1..30})
for type in ${TYPES:-q4_0 q8_0 f16}; do
  mqlm make-model --preset llama3-8b --type "$type" --pure -o /tmp/m.gguf >>"$log"
  echo "command: mqlm generate llama3-8b-$type.gguf -p <602 tokens> -n 128 --temperature 0 --warmup -q" >>"$log"
  mqlm generate /tmp/m.gguf -p "$prompt" -n 128 --temperature 0 --warmup -q 2>>"$log"
  rm -f /tmp/m.gguf
done
cat "$log"
