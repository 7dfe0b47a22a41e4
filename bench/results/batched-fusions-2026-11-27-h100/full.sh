#!/usr/bin/env bash
# A server whose prefix cache fills: bench/run-serve-on-h100.sh with PASSES=3 (pass 1 fills the
# 8,192 pages; passes 2 and 3 evict and spill on every prompt), this build then the one before.
cd "$(dirname "$0")/.."
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
cp .devrun/bin/mqlm /tmp/mqlm-new
for v in ${ORDER:-new base}; do
  if [ $v = base ]; then cp .devrun/bin/mqlm-base .devrun/bin/mqlm; else cp /tmp/mqlm-new .devrun/bin/mqlm; fi
  o=/tmp/o-$v; mkdir -p $o
  OUT=$o PASSES=${PASSES:-3} bench/run-serve-on-h100.sh > /dev/null 2>&1
  echo "== $v"; grep -E "^command|Output token throughput|TTFT|ITL|equal|failed" $o/serve-h100.txt | sed 's/--json.*//'
  grep -c "pages out" $o/serve-stdout.txt; grep "pages out" $o/serve-stdout.txt | awk '{for(i=1;i<=NF;i++) if($i=="recording") print $(i-2)}' | sort -n | tail -3 | tr '\n' ' '; echo
done
tar czf $OUT/full.tgz -C /tmp o-new o-base
