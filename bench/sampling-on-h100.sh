#!/usr/bin/env bash
# Sampled beside greedy on the H100 (issue 32), one call, one server: `mqlm bench serve` with
# 128-token prompts and outputs at concurrency 1, 8, 32 and 64 (4 rounds each, at least 16
# requests), greedy (temperature 0) and sampled (temperature 0.7, top_p 0.95) at each concurrency
# (which first alternates by pass), then `mqlm generate -n 128` greedy and sampled, on the llama3-8b preset in Q4_0 (pure). Writes $OUT/sampling-h100.txt and a JSON per run.
# Here: cmake --build build && ../shared/tools/devpack -o .devrun build/mqlm (see DEVICE.md)
# There (carry .devrun): bench/sampling-on-h100.sh   (PASSES: repeat the list; GENERATE_ROUNDS: 2)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
log=$OUT/sampling-h100.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$log"
mqlm make-model --preset "${PRESET:-llama3-8b}" --type q4_0 --pure -o /tmp/m.gguf >>"$log"
prompt=$(python3 -c "print(' '.join(['word'] * 100))")
for round in $(seq 1 ${GENERATE_ROUNDS:-2}); do
  for sampling in "--temperature 0" "--temperature 0.7 --top-p 0.95" "--temperature 1"; do
    cmd="mqlm generate /tmp/m.gguf -p \"<100 words>\" -n 128 $sampling --seed 7 --warmup -q"
    echo "command: $cmd (round $round)" >>"$log"
    mqlm generate /tmp/m.gguf -p "$prompt" -n 128 $sampling --seed 7 --warmup -q 2>&1 | grep -E "decode|prefill" >>"$log"
  done
done
listen=tcp://127.0.0.1:5555
source bench/serve-lib.sh
start_server "$log" /tmp/m.gguf --name llama3-8b --listen $listen --insecure --kv-pages 8192 --max-sequences 64 --token-budget 2048
for pass in $(seq 1 ${PASSES:-1}); do
  for c in ${CONCURRENCY:-1 8 32 64}; do
    # Which goes first alternates: a server's first runs can be faster than its later ones.
    modes="greedy sampled"
    [ $((pass % 2)) = 0 ] && modes="sampled greedy"
    for mode in $modes; do
      flags="--temperature 0"
      [ $mode = sampled ] && flags="--temperature 0.7 --top-p 0.95"
      # A seed of its own for each run: repeated prompts would be prefix-cache hits.
      seed=$((c + 100 * pass))
      [ $mode = sampled ] && seed=$((seed + 50))
      # At least 16 requests: one request's 128 tokens alone time too little.
      requests=$((c * ${ROUNDS:-4}))
      [ $requests -lt 16 ] && requests=16
      cmd="mqlm bench serve --server $listen --model llama3-8b --requests $requests --concurrency $c --prompt-tokens 128 --output-tokens 128 $flags --warmup $c --seed $seed --json $OUT/serve-$mode-c$c-p$pass.json"
      echo "command: $cmd" >>"$log"
      $cmd >>"$log" 2>&1 || { echo "bench serve at concurrency $c ($mode) failed" >>"$log"; break 3; }
    done
  done
done
kill -TERM $server; wait $server || true
tail -5 $OUT/serve-log.txt >>"$log"
cat "$log"
