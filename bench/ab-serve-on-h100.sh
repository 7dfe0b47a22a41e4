#!/usr/bin/env bash
# `mqlm bench serve` with builds against each other on one machine, in one command: each build in
# .devrun/bin serves in turn (bench/run-serve-on-h100.sh: llama3-8b preset, a fresh server each
# time), ROUNDS times over, alternated. Writes $OUT/ab-serve.txt and each run's folder.
# Here: pack the builds as bench/ab-on-h100.sh's header says (.devrun/bin/mqlm, .devrun/bin/mqlm-base).
# There (carry .devrun): bench/ab-serve-on-h100.sh
# Knobs: BUILDS ("mqlm mqlm-base"), ROUNDS (2), CONCURRENCY ("1 32"), TEMPERATURES ("0"; e.g. "0 0.7"
# runs each build greedy and sampled), REQUESTS_PER_SLOT (4: each concurrency c runs 4c requests), TYPE (q4_0),
# PRESET (llama3-8b), and run-serve-on-h100.sh's own (KV_PAGES, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/* 2>/dev/null || true
log=$OUT/ab-serve.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$log"
builds=${BUILDS:-mqlm mqlm-base}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for temperature in ${TEMPERATURES:-0}; do
    for b in $builds; do
      # The build under test as `mqlm` in a folder run-serve-on-h100.sh puts first on PATH.
      bin=$(mktemp -d)
      ln -s "$PWD/.devrun/bin/$b" "$bin/mqlm"
      run=$OUT/r$round-t$temperature-$b
      mkdir -p "$run"
      BIN_FIRST=$bin OUT=$run ROUNDS=${REQUESTS_PER_SLOT:-4} TEMPERATURE=$temperature CONCURRENCY=${CONCURRENCY:-1 32} \
        bench/run-serve-on-h100.sh >/dev/null 2>&1 || echo "round $round $b: run-serve failed" >>"$log"
      figures=$(awk '/^command:/ { for (i = 1; i < NF; i++) if ($i == "--concurrency") c = $(i + 1) }
                     /^Output token throughput/ { printf "c%s %s tok/s", c, $NF }
                     /^TPOT/ { printf " (TPOT %s ms); ", $2 }' "$run/serve-h100.txt")
      echo "round $round | temperature $temperature | $b | $figures" >>"$log"
      rm -rf "$bin"
    done
  done
done
cat "$log"
