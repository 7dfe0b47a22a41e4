#!/usr/bin/env bash
# bench/run-serve-on-h100.sh with this build, the one before, this build again (one machine).
cd "$(dirname "$0")/.."
cp .devrun/bin/mqlm /tmp/mqlm-new
for v in new base new2; do
  if [ $v = base ]; then cp .devrun/bin/mqlm-base .devrun/bin/mqlm; else cp /tmp/mqlm-new .devrun/bin/mqlm; fi
  mkdir -p $OUT/serve-$v
  OUT=$OUT/serve-$v CONCURRENCY="${CONCURRENCY:-1 32}" PASSES=${PASSES:-2} bench/run-serve-on-h100.sh > /dev/null 2>&1
  echo "== $v"; grep -E "^command|Output token throughput|TTFT|equal" $OUT/serve-$v/serve-h100.txt
done
cp /tmp/mqlm-new .devrun/bin/mqlm
