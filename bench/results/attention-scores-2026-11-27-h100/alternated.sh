#!/usr/bin/env bash
# c1 and c32 alternated three times on one server (this build).
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done; chmod +x .devrun/bin/*
CONCURRENCY="1 32" PASSES=3 ROUNDS=8 KV_PAGES=16384 bench/run-serve-on-h100.sh
grep -E "command|Output token throughput|TTFT " $OUT/serve-h100.txt
