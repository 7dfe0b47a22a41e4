#!/usr/bin/env bash
for f in .devrun/bin/*.xz; do xz -d "$f"; done
chmod +x .devrun/bin/*
mv .devrun/bin/mqlm .devrun/bin/mqlm-after
R=$OUT
for b in after before after before; do
  cp .devrun/bin/mqlm-$b .devrun/bin/mqlm
  mkdir -p $R/$b-$RANDOM; d=$(ls -td $R/$b-* | head -1)
  OUT=$d CONCURRENCY="1 32" timeout 110 bench/run-serve-on-h100.sh > /dev/null 2>&1
  echo "$b: $(grep -E 'Output token throughput' $d/serve-h100.txt | awk '{print $NF}' | tr '\n' ' ')"
done
