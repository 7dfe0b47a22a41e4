#!/usr/bin/env bash
# The model pool's timings on the H100, in one command: two models of the llama3-8b preset (Q4_0)
# under a memory ceiling that holds one of them, so each switch evicts the other. Measures, ROUNDS
# times:
#   - load request to first token: `mqlm client -n 1` for a model that is not loaded (the request
#     loads it: cold when nothing is loaded, a switch when the other model must be evicted first),
#     against the same request once the model is loaded;
#   - an admin load (POST /api/models/{id}/load, answered when the weights are on the GPU);
#   - unload request to Unloaded (POST /api/models/{id}/unload?wait=true: the server's unload_ms
#     and total_ms, the bytes freed, what the pool holds after), idle and with 8 streams open.
# Writes $OUT/pool-h100.txt (every figure, one line each) and the server's log (serve-stdout.txt).
# Here: cmake --build build && ../shared/tools/devpack -o .devrun build/mqlm && strip .devrun/bin/mqlm
# There (carry .devrun): bench/run-pool-on-h100.sh     (PRESET=tiny runs it anywhere, e.g. lavapipe)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh 2>/dev/null || true  # its last test fails where there is no NVIDIA driver
log=$OUT/pool-h100.txt
preset=${PRESET:-llama3-8b} type=${TYPE:-q4_0} rounds=${ROUNDS:-5}
listen=tcp://127.0.0.1:${ZMQ_PORT:-5555} http=127.0.0.1:${HTTP_PORT:-8080}
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true; } >"$log"
say() { echo "$*" >>"$log"; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
field() { grep -o "\"$1\":[^,}]*" | head -1 | cut -d: -f2- | tr -d '"'; }

mqlm make-model --preset "$preset" --type "$type" --pure -o /tmp/pool-model.gguf >>"$log"
server=
stop_server() { [ -n "$server" ] && { kill -TERM "$server" 2>/dev/null || true; wait "$server" || true; }; server=; }
trap stop_server EXIT
start_server() {  # extra serve flags...
  : >$OUT/serve-stdout.txt
  mqlm --log-level info serve --model a=/tmp/pool-model.gguf --model b=/tmp/pool-model.gguf \
    --listen $listen --insecure --http $http --kv-pages ${KV_PAGES:-1024} ${POOL_BLOCK_MIB:+--pool-block-mib $POOL_BLOCK_MIB} "$@" \
    >$OUT/serve-stdout.txt 2>&1 &
  server=$!
  for _ in $(seq 1 600); do
    grep -q ready $OUT/serve-stdout.txt 2>/dev/null && return 0
    kill -0 $server 2>/dev/null || { say "mqlm serve ended before it was ready"; tail -20 $OUT/serve-stdout.txt >>"$log"; exit 1; }
    sleep 0.2
  done
  say "mqlm serve was not ready in 120 s"; exit 1
}
post() { curl -s -X POST -d '' "http://$http$1"; }

# What one model needs, as the server estimates it before loading (weights and its KV pages).
start_server
cp $OUT/serve-stdout.txt $OUT/serve-log-estimate.txt
estimate=$(curl -s "http://$http/api/status" | grep -o '"estimated_bytes":[0-9]*' | head -1 | cut -d: -f2)
stop_server
ceiling=$((estimate * 3 / 2))
say "model: $preset $type, estimated $estimate bytes; ceiling $ceiling bytes (one model fits, two do not)"
start_server --memory-ceiling "$ceiling"

first_token() {  # model label: time of a one-token greedy request, the load it causes included
  local t0 t1
  t0=$(now_ms)
  mqlm client --server $listen --model "$1" -n 1 --temperature 0 -p "The quick brown fox" --timeout-ms 600000 \
    >/dev/null 2>$OUT/client.txt
  t1=$(now_ms)
  say "$2 model=$1 ms=$((t1 - t0)) | $(grep finish: $OUT/client.txt)"
}
unload() {  # model label
  local t0 t1 answer
  t0=$(now_ms)
  answer=$(post "/api/models/$1/unload?wait=true")
  t1=$(now_ms)
  [ -n "${VERBOSE:-}" ] && say "$answer"
  say "$2 model=$1 client_ms=$((t1 - t0)) unload_ms=$(field unload_ms <<<"$answer") total_ms=$(field total_ms <<<"$answer") freed_bytes=$(field freed_bytes <<<"$answer") held_after=$(field held_after <<<"$answer") problems=$(field problems <<<"$answer")"
}
admin_load() {  # model label
  local t0 t1 answer
  t0=$(now_ms)
  answer=$(post "/api/models/$1/load")
  t1=$(now_ms)
  say "$2 model=$1 ms=$((t1 - t0)) evicted=$(grep -o '"evicted":\[[^]]*\]' <<<"$answer" | cut -d: -f2)"
}

for r in $(seq 1 "$rounds"); do
  say "round $r"
  first_token a load_to_first_token_cold  # nothing loaded
  first_token a first_token_loaded
  admin_load b admin_load_evicting        # evicts a (idle)
  first_token a load_to_first_token_switch  # evicts b (idle), loads a
  unload a unload_idle
  admin_load a admin_load_cold
  streams=()
  for i in $(seq 1 8); do  # 8 streams open while a is unloaded: each ends with a final event
    mqlm client --server $listen --model a -n ${STREAM_TOKENS:-4000} --temperature 1 -p "Once upon a time" \
      --timeout-ms 600000 >$OUT/stream.txt 2>&1 &
    streams+=($!)
  done
  sleep 2
  unload a unload_8_streams
  ended=0
  for pid in "${streams[@]}"; do wait "$pid" || ended=$((ended + 1)); done
  say "streams ended by the unload (client exit status not 0): $ended of 8"
done
say "status after: $(curl -s "http://$http/api/status" | grep -o '"pool":{[^}]*}' | head -1)"
say "threads: $(ls /proc/$server/task | wc -l)"
stop_server
grep -E "enforcer|unloaded|loaded" $OUT/serve-stdout.txt | tail -12 >>"$log"
cat "$log"
