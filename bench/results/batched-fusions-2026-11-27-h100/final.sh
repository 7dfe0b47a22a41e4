#!/usr/bin/env bash
cd "$(dirname "$0")/.."
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
o=/tmp/o; mkdir -p $o
.devrun/bin/mqlm_gpu_tests --gtest_filter='NarrowGlu.*:DirectMatmul.*:F16Inputs.*:RopeKvWrite.*:AttentionQ8.*' > $o/gpu-tests-h100.txt 2>&1; echo "mqlm_gpu_tests (filtered) rc=$?"; grep -E "PASSED|FAILED|SKIPPED \]" $o/gpu-tests-h100.txt
.devrun/bin/llama_gpu_tests > $o/llama-tests-h100.txt 2>&1; echo "llama_gpu_tests rc=$?"; tail -1 $o/llama-tests-h100.txt
OUT=$o PASSES=${PASSES:-3} bench/run-serve-on-h100.sh > /dev/null 2>&1
grep -E "^date|H100|^command|Output token throughput|TTFT|TPOT|equal|failed" $o/serve-h100.txt
tar czf $OUT/final.tgz -C $o .
