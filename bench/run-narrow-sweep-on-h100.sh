#!/usr/bin/env bash
# The narrow (tensor-core decode-batch) matmul on the H100: every matmul of a Llama-3-8B layer at
# 16 to 512 tokens with the default workgroup shape, then the shapes worth trying at 32 and 64.
# Here: cmake --build build && rm -rf .devrun && ../shared/tools/devpack -o .devrun build/mqlm && strip .devrun/bin/*
# There (carry .devrun): bench/run-narrow-sweep-on-h100.sh   (writes $OUT/narrow-*.md)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
mqlm bench kernels --matmul-only --types ${TYPES:-q4_0,q8_0} --tokens ${TOKENS:-16,32,64,128,512} \
  --out "$OUT/narrow-default.md" 2>&1 | grep -E "narrow|coopmat|tiled" || true
for shape in ${SHAPES:-1x1x4x2 1x2x2x2 2x1x4x2 2x2x2x2 2x1x4x1 3x1x4x1 4x1x4x1 2x4x1x2 1x4x1x2}; do
  echo "== shape $shape"
  mqlm bench kernels --matmul-only --types q4_0 --tokens 32,64 --narrow-shape "$shape" \
    --out "$OUT/narrow-$shape.md" 2>&1 | grep -E "narrow" || true
done
