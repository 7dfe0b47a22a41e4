#!/usr/bin/env bash
# `mqlm bench serve` against `mqlm serve` with the llama3-8b preset in Q4_0 on the H100, in one
# command: concurrency 1, 8, 32 and 64 (llama.cpp's comparison point: 128-token prompts and
# outputs). Writes $OUT/serve-h100.txt and one JSON per concurrency.
# Here: cmake --build build && ../shared/tools/devpack -o .devrun build/mqlm && strip .devrun/bin/mqlm
# There (carry .devrun): bench/run-serve-on-h100.sh   (SERVE_FLAGS: more flags for mqlm serve, e.g. --no-overlap;
# PASSES: repeat the concurrency list; TEMPERATURE: the requests' temperature, 0 (greedy) by default, passed explicitly since bench serve samples (0.7) unless told; TOP_P: their top_p at a temperature above 0, 0.95 by default (bench serve's); KV_PAGES: 8192 pages of 16 tokens by default, 16 GiB for llama3-8b, which these runs never fill)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
# BIN_FIRST: a folder whose `mqlm` runs instead of .devrun's (bench/ab-serve-on-h100.sh's builds)
[ -n "${BIN_FIRST:-}" ] && export PATH="$BIN_FIRST:$PATH"
log=$OUT/serve-h100.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$log"
type=${TYPE:-q4_0}
mqlm make-model --preset "${PRESET:-llama3-8b}" --type "$type" --pure -o /tmp/m.gguf >>"$log"
listen=tcp://127.0.0.1:5555
source bench/serve-lib.sh
# --insecure: loopback, and figures of the plain protocol as every earlier run measured them.
start_server "$log" /tmp/m.gguf --name llama3-8b --listen $listen --insecure --kv-pages ${KV_PAGES:-8192} \
  --max-sequences 64 --token-budget ${TOKEN_BUDGET:-2048} ${SERVE_FLAGS:-}
# The batched (tensor-core) path must give the lone request's greedy tokens before it is timed.
bench/check-batched-greedy.sh $listen 16 32 >>"$log" 2>&1 || echo "the batched greedy check failed" >>"$log"
# PASSES > 1 repeats the list (pass p writes serve-c<C>-p<p>.json): alternating concurrencies on one
# warm server shows how much a figure moves between runs.
for pass in $(seq 1 ${PASSES:-1}); do
  for c in ${CONCURRENCY:-1 8 32 64}; do
    n=$((c * ${ROUNDS:-4}))
    # A seed of its own for each concurrency and pass: the prompts come from the seed, and prompts
    # repeated from an earlier run would be prefix-cache hits (or restores from the host tier).
    seed=$((c + 1000 * (pass - 1)))
    json=$OUT/serve-c$c.json
    [ "${PASSES:-1}" -gt 1 ] && json=$OUT/serve-c$c-p$pass.json
    cmd="mqlm bench serve --server $listen --model llama3-8b --requests $n --concurrency $c --prompt-tokens 128 --output-tokens 128 --temperature ${TEMPERATURE:-0} --top-p ${TOP_P:-0.95} --warmup $c --seed $seed --json $json"
    echo "command: $cmd" >>"$log"
    $cmd >>"$log" 2>&1 || { echo "bench serve at concurrency $c failed" >>"$log"; break 2; }
  done
done
kill -TERM $server; wait $server || true
tail -5 $OUT/serve-log.txt >>"$log"
cat "$log"
