#!/usr/bin/env bash
# c1 and c32 alternated three times on one fresh server whose cache never fills (16,384 pages),
# 8 rounds each: bench/run-serve-on-h100.sh with CONCURRENCY="1 32" PASSES=3 ROUNDS=8 KV_PAGES=16384.
cd "$(dirname "$0")/.."
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
o=/tmp/o; mkdir -p $o
OUT=$o CONCURRENCY="1 32" PASSES=3 ROUNDS=8 KV_PAGES=16384 bench/run-serve-on-h100.sh > /dev/null 2>&1
grep -E "^date|H100|equal|^command|Output token throughput|TTFT" $o/serve-h100.txt | sed 's/--json.*//'
tar czf $OUT/ratio.tgz -C $o .
