#!/usr/bin/env bash
# Call A: llama.cpp's build in the background; the files; the GPU tests of the new kernels; bench kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
[ -x /tmp/llamacpp/bin/llama-bench ] || { bash .devrun/peer/llamacpp-build.sh > /tmp/llamacpp-build.log 2>&1 & b=$!; }
B=.devrun/bin/mqlm
mkdir -p /tmp/quant-types; cd /tmp/quant-types
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee $OUT/callA.txt
cd - >/dev/null
for spec in "gemma3-4b q4_k_m" "gemma3-4b q4_0 --pure" "qwen3moe-30b-a3b q4_k_m" "llama3-8b q4_0 --pure"; do
  set -- $spec; f=/tmp/quant-types/$1-$2${3:+-pure}.gguf
  [ -f $f ] || $B make-model --preset $1 --type $2 $3 -o $f 2>&1 | tail -1 | tee -a $OUT/callA.txt
done
.devrun/bin/mqlm_gpu_tests --gtest_filter='NarrowExperts*:MoeSort*:*experts*:*Experts*:AttentionMerge*:RopeKvWrite*:QuantizeQ8*' 2>&1 | tail -15 | tee -a $OUT/callA.txt
.devrun/bin/llama_gpu_tests --gtest_filter='*GpuModelExperts*' 2>&1 | tail -6 | tee -a $OUT/callA.txt
$B bench kernels --experts-only --tokens 1,8,16,64,512 --types q4_k,q6_k --out $OUT/kernels-experts.md > $OUT/kernels-experts.log 2>&1; tail -3 $OUT/kernels-experts.log
cat $OUT/kernels-experts.md | tee -a $OUT/callA.txt
if [ -n "${b:-}" ]; then wait $b; echo "llama.cpp build: $?"; tail -3 /tmp/llamacpp-build.log; fi
ls /tmp/llamacpp/bin | head -3
