#!/usr/bin/env bash
# The narrow (tensor-core) matmul, shaders/mul_mm_staged.comp, on the H100 in one command: the
# kernel table (with and without K split where it applies), optionally a sweep of the workgroup
# shapes and K splits, then `mqlm generate` (a 602-token prefill alone; 32 and 64 sequences decoded
# side by side, with the step's GPU profile). Writes $OUT/staged-*.
# Here: cmake --build build && rm -rf .devrun && ../shared/tools/devpack -o .devrun build/mqlm && strip .devrun/bin/*
# There (carry .devrun): SHAPES="4x1x1x4 4x2x2x2" SPLITS="4 8" bench/run-staged-matmul-on-h100.sh
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$OUT/staged-info.txt"
mqlm bench kernels --tokens "${TOKENS:-1,8,16,32,64,512}" --types "${KTYPES:-q4_0,q8_0,f16}" --matmul-only \
  --target-ms 10 --out "$OUT/staged-kernels.md" >/dev/null 2>"$OUT/staged-kernels.err"
for shape in ${SHAPES:-}; do
  echo "--staged-shape $shape" >>"$OUT/staged-sweep.txt"
  mqlm bench kernels --tokens "${SWEEP_TOKENS:-64,512}" --types q4_0 --matmul-only --target-ms 10 --staged-shape "$shape" \
    2>/dev/null | grep staged >>"$OUT/staged-sweep.txt"
done
for splits in ${SPLITS:-}; do
  echo "--staged-splits $splits" >>"$OUT/staged-sweep.txt"
  mqlm bench kernels --tokens "${SPLIT_TOKENS:-16,64}" --types q4_0 --matmul-only --target-ms 10 --staged-splits "$splits" \
    2>/dev/null | grep "K in" >>"$OUT/staged-sweep.txt"
done
mqlm make-model --preset llama3-8b --type "${TYPE:-q4_0}" --pure -o /tmp/m.gguf >>"$OUT/staged-info.txt"
long=$(printf 'The quick brown fox jumps over the lazy dog, and then it runs back home. %.0s' {1..30})
short="In a quiet village by the sea there lived an old fisherman who every morning walked down to the harbour"
log=$OUT/staged-generate.txt
echo "command: mqlm generate llama3-8b-${TYPE:-q4_0}.gguf -p <602 tokens> -n 32 --temperature 0 --warmup" >"$log"
mqlm generate /tmp/m.gguf -p "$long" -n 32 --temperature 0 --warmup >>"$log" 2>&1
for b in ${BATCHES:-32 64}; do
  echo "command: mqlm generate llama3-8b-${TYPE:-q4_0}.gguf -p \"$short\" -n 64 --temperature 0 --batch $b --warmup --profile" >>"$log"
  mqlm generate /tmp/m.gguf -p "$short" -n 64 --temperature 0 --batch "$b" --warmup --profile >>"$log" 2>&1
done
tail -n +1 "$OUT"/staged-info.txt "$log"
grep staged "$OUT/staged-kernels.md"
cat "$OUT/staged-sweep.txt" 2>/dev/null
