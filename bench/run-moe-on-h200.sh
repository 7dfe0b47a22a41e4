#!/usr/bin/env bash
# Mixtures of experts on the H200, in one command: qwen3moe-30b-a3b-shaped Q4_K_M (llama-quantize's
# mixture, written by make-model) through `mqlm generate` (a 602-token prefill, 128 greedy decode
# tokens; then a profiled run for where a step's time goes) and through llama.cpp's CUDA llama-bench
# (pp512, tg128), built meanwhile from llamacpp-peer's pack; llama3-8b Q4_0 decode as the dense
# baseline. Writes $OUT/moe-h200.txt.
# Here: cmake --build build --target mqlm && ../shared/tools/devpack -o .devrun build/mqlm &&
#   strip .devrun/bin/mqlm && ../shared/tools/llamacpp-peer pack "$PWD/.devrun/peer"
# There (carry .devrun): bench/run-moe-on-h200.sh
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh || true
log=$OUT/moe-h200.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$log"
(bash .devrun/peer/llamacpp-build.sh >/tmp/peer-build.log 2>&1 || echo "llama.cpp build failed" >>/tmp/peer-build.log) &
build=$!
prompt=$(printf 'The quick brown fox jumps over the lazy dog, and then it runs back home. %.0s' {1..30})
mqlm make-model --preset qwen3moe-30b-a3b --type q4_k_m -o /tmp/moe.gguf >>"$log"
echo "command: mqlm generate qwen3moe-30b-a3b-q4_k_m.gguf -p <602 tokens> -n 128 --temperature 0 --warmup -q" >>"$log"
mqlm generate /tmp/moe.gguf -p "$prompt" -n 128 --temperature 0 --warmup -q 2>>"$log"
echo "command: the same, --profile -n 32" >>"$log"
mqlm generate /tmp/moe.gguf -p "$prompt" -n 32 --temperature 0 --profile -q 2>>"$log" || true
wait "$build"
tail -1 /tmp/peer-build.log >>"$log"
if [[ -x /tmp/llamacpp/bin/llama-bench ]]; then
  /tmp/llamacpp/bin/llama-bench -m /tmp/moe.gguf -p 512 -n 128 -fa 1 -ngl 99 -r 2 >>"$log" 2>/tmp/bench.err || tail -5 /tmp/bench.err >>"$log"
fi
rm -f /tmp/moe.gguf
if ((SECONDS < 420)); then
  mqlm make-model --preset llama3-8b --type q4_0 --pure -o /tmp/m.gguf >>"$log"
  echo "command: mqlm generate llama3-8b-q4_0.gguf -p <602 tokens> -n 128 --temperature 0 --warmup -q" >>"$log"
  mqlm generate /tmp/m.gguf -p "$prompt" -n 128 --temperature 0 --warmup -q 2>>"$log"
fi
cat "$log"
