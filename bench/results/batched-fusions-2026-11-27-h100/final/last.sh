#!/usr/bin/env bash
# The final build: bench/run-serve-on-h100.sh as the issue measures it (fresh server, once each),
# then c1 and c32 alternated three times (8 rounds, 16,384 pages: nothing evicted).
cd "$(dirname "$0")/.."
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
mkdir -p /tmp/o1 /tmp/o2
OUT=/tmp/o1 bench/run-serve-on-h100.sh > /dev/null 2>&1
OUT=/tmp/o2 CONCURRENCY="1 32" PASSES=3 ROUNDS=8 KV_PAGES=16384 bench/run-serve-on-h100.sh > /dev/null 2>&1
for o in /tmp/o1 /tmp/o2; do echo "== $o"; awk '/^date/{print} /equal/{print} /^command/{split($0,a,"--concurrency "); split(a[2],b," "); c=b[1]; split($0,d,"--seed "); split(d[2],e," "); s=e[1]} /Output token/{o=$NF} /^TTFT/{t=$2" / "$NF} /^TPOT/{print "c"c, "seed "s, o, "TTFT mean/p99 "t, "TPOT mean "$2}' $o/serve-h100.txt; done
tar czf $OUT/last.tgz -C /tmp o1 o2
