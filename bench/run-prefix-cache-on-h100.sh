#!/usr/bin/env bash
# Time to first token of a long prompt on the H100, in one command: the llama3-8b preset (Q4_0), an
# 8,000-token prompt P, measured ROUNDS times each way:
#   cold  P on a server that has never seen it (a fresh server each round: nothing cached);
#   hot   P after two other 8,000-token prompts pushed every page of P out of the GPU's KV cache
#         (--kv-pages 640 holds 10,240 tokens) into the hot tier;
#   ssd   P after a restart: the first server wrote P's pages to the SSD folder when it stopped
#         (--cache-close drain), the new one reads them back (with the OS's page cache dropped
#         first where this machine lets us, else said so in the results).
# Each TTFT is the server's own (FinalEvent.ttft_ns: submit to first token), from `mqlm client
# --json`; the restored and computed token counts are checked and written beside it.
# Writes $OUT/prefix-cache-h100.txt and the servers' logs.
# Here: cmake --build build && ../shared/tools/devpack -o .devrun build/mqlm && strip .devrun/bin/mqlm
# There (carry .devrun): bench/run-prefix-cache-on-h100.sh   (PRESET=tiny PROMPT_TOKENS=200 KV_PAGES=20 anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
source .devrun/env.sh 2>/dev/null || true
log=$OUT/prefix-cache-h100.txt
preset=${PRESET:-llama3-8b} type=${TYPE:-q4_0} rounds=${ROUNDS:-3} n=${PROMPT_TOKENS:-8000} pages=${KV_PAGES:-640}
listen=tcp://127.0.0.1:${ZMQ_PORT:-5555} http=127.0.0.1:${HTTP_PORT:-8080}
ssd=${SSD_DIR:-/tmp/mqlm-ssd-cache}
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true; } >"$log"
say() { echo "$*" | tee -a "$log"; }
mqlm make-model --preset "$preset" --type "$type" --pure -o /tmp/prefix-model.gguf >/dev/null
# Three different prompts of n token ids (below the tiny preset's vocabulary too).
prompt() { seq "$1" "$2" $(($1 + ($n - 1) * $2)) | awk '{ printf "%s%d", (NR > 1 ? "," : ""), 1 + $1 % 1000 }'; }
P=$(prompt 3 7) Q=$(prompt 5 11) R=$(prompt 2 13)
say "model: $preset $type; prompt $n tokens; --kv-pages $pages; rounds $rounds"

server=
stop_server() { [ -n "$server" ] && { kill -TERM "$server" 2>/dev/null || true; wait "$server" || true; }; server=; }
trap stop_server EXIT
start_server() {  # name, extra serve flags...
  local name=$1; shift
  mqlm --log-level info serve /tmp/prefix-model.gguf --listen $listen --insecure --http $http --kv-pages "$pages" "$@" \
    >"$OUT/serve-$name.txt" 2>&1 &
  server=$!
  for _ in $(seq 1 600); do
    grep -q ready "$OUT/serve-$name.txt" 2>/dev/null && return 0
    kill -0 $server 2>/dev/null || { say "mqlm serve ended before it was ready"; tail -20 "$OUT/serve-$name.txt" >>"$log"; exit 1; }
    sleep 0.2
  done
  say "mqlm serve was not ready in 120 s"; exit 1
}
field() { grep -o "\"$1\":[^,}]*" | tail -1 | cut -d: -f2-; }
run() {  # label prompt: one greedy token; prints the TTFT and what the prefix cache gave
  local final status
  final=$(mqlm client --server $listen --tokens "$2" -n 1 --temperature 0 --json --no-stream --timeout-ms 600000 | tail -1)
  status=$(curl -s "http://$http/api/status")
  say "$1 ttft_ms=$(echo "$final" | field ttft_ms) cached_tokens=$(echo "$final" | field cached_tokens)" \
    "restored_hot=$(echo "$status" | field restored_hot_tokens) restored_ssd=$(echo "$status" | field restored_ssd_tokens)" \
    "computed=$(echo "$status" | field computed_tokens) token=$(echo "$final" | grep -o '"tokens":\[[0-9,]*\]' | head -1)"
}
warm_up() { mqlm client --server $listen --tokens 999,998,997,996 -n 2 --temperature 0 --timeout-ms 600000 >/dev/null; }
drop_page_cache() {
  sync
  if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then echo "page cache dropped"; else echo "page cache NOT dropped (no permission): SSD reads may come from RAM"; fi
}

for round in $(seq 1 "$rounds"); do
  rm -rf "$ssd"
  start_server "r$round-a" --hot-cache 4G --ssd-cache-dir "$ssd" --ssd-cache 8G --cache-close drain
  warm_up
  run "round=$round cold" "$P"
  run "round=$round push-out-1" "$Q"
  run "round=$round push-out-2" "$R"
  run "round=$round hot" "$P"
  stop_server  # drains the hot tier to SSD
  say "round=$round ssd folder: $(du -sb "$ssd" | cut -f1) bytes in $(ls "$ssd" | wc -l) files; $(drop_page_cache)"
  start_server "r$round-b" --hot-cache 4G --ssd-cache-dir "$ssd" --ssd-cache 8G
  warm_up
  run "round=$round ssd" "$P"
  stop_server
done
say "done"
