#!/usr/bin/env bash
# `mqlm serve` with llama-server's flags (-m, --host, --port, -c, -np, -ngl): HTTP alone unless
# --listen asks for ZeroMQ, the context length as KV pages, one info line per finished request,
# and a taken address refused with the address and the flag to change.
# Usage: serve_flags_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
source "$(dirname "${BASH_SOURCE[0]}")/../actors/http/http_server.sh"
rm -rf "$dir"
mkdir -p "$dir"
source "$(dirname "${BASH_SOURCE[0]}")/../checks.sh"
"$mqlm" make-model --preset tiny --type f16 -o "$dir/tiny.gguf" >"$dir/make.log" 2>&1 ||
  { fail "make the tiny model" "$dir/make.log"; exit 1; }

complete() {  # complete OUTPUT MAX_TOKENS: a completion of model "flagged"; prints the HTTP status
  curl -s -o "$1" -w '%{http_code}' "$http_url/v1/completions" -H "Content-Type: application/json" \
    -d "{\"model\": \"flagged\", \"prompt\": \"Once upon a time\", \"max_tokens\": $2, \"temperature\": 0}"
}

# Refused before anything starts: flags that contradict each other, a missing file.
refused() {  # refused PATTERN SERVE_ARGS...: exits non-zero at once, saying PATTERN
  local pattern=$1
  shift
  timeout 20 "$mqlm" serve "$@" >"$dir/refused.out" 2>&1
  local rc=$?
  [[ $rc -ne 0 && $rc -ne 124 ]] && grep -q -- "$pattern" "$dir/refused.out" ||
    fail "serve $*: exit $rc, wanted a refusal saying '$pattern'" "$dir/refused.out"
}
refused "--http excludes --port" -m "$dir/tiny.gguf" --http 127.0.0.1:1 --port 2
refused "excludes --ctx-size" -m "$dir/tiny.gguf" -c 64 --kv-pages 4
refused "none.gguf: no such file" -m "$dir/tiny.gguf" -m "$dir/none.gguf"
refused "two models named" "$dir/tiny.gguf" -m "$dir/tiny.gguf"

# -c 100 of 16-token pages: 7 pages, 112 tokens. -np 1: one sequence runs at a time.
port=$(free_port)
start_server_at "$port" --log-level info serve -m "$dir/tiny.gguf" --served-model-name flagged --host 127.0.0.1 \
  --port "$port" -c 100 -np 1 -ngl 99 || { fail "serve with llama-server's flags did not start"; exit 1; }
grep -qx "ready: listening on http://127.0.0.1:$port" "$dir/serve.log" ||
  fail "not HTTP alone without --listen" "$dir/serve.log"
[[ $(curl -s "$http_url/api/status" | jq '.kv_pages.total') == 7 ]] || fail "-c 100 did not give 7 KV pages"

code=$(complete "$dir/done.json" 8)
[[ $code == 200 ]] || fail "a completion: HTTP $code" "$dir/done.json"
code=$(complete "$dir/long.json" 200)
[[ $code == 400 ]] && grep -q "112 tokens" "$dir/long.json" || fail "over -c: HTTP $code, not 400 naming 112 tokens" "$dir/long.json"

# The finished request's line carries what its client was told.
usage=$(jq -r '.usage | "prompt_tokens=\(.prompt_tokens) cached_tokens=\(.prompt_tokens_details.cached_tokens) completion_tokens=\(.completion_tokens)"' "$dir/done.json")
line=$(grep -E "request done: id=http-[0-9]+ model=flagged $usage ttft_ms=[0-9.]+ total_ms=[0-9.]+ finish=length$" "$dir/serve.log")
[[ -n $line ]] || fail "no request line with $usage and finish=length" "$dir/serve.log"
ttft=$(sed -E 's/.*ttft_ms=([0-9.]+).*/\1/' <<<"$line")
total=$(sed -E 's/.*total_ms=([0-9.]+).*/\1/' <<<"$line")
awk -v t="$ttft" -v a="$total" 'BEGIN { exit !(t > 0 && a >= t) }' || fail "times out of order: ttft $ttft, total $total"
grep -qE "request done: id=http-[0-9]+ model=flagged prompt_tokens=[0-9]+ .* finish=error error=prompt_too_long$" \
  "$dir/serve.log" || fail "no request line for the refused long request" "$dir/serve.log"

# -np 1: of two requests at once, one runs and the other waits.
complete "$dir/a.json" 90 >/dev/null &
first=$!
complete "$dir/b.json" 90 >/dev/null &
second=$!
most_running=0 waited=0
for _ in $(seq 100); do
  read -r running waiting < <(curl -s "$http_url/api/status" | jq -r '"\(.requests.running) \(.requests.waiting)"')
  ((running > most_running)) && most_running=$running
  ((waiting > 0 && running == 1)) && waited=1
  [[ -s $dir/a.json && -s $dir/b.json ]] && break
  sleep 0.05
done
wait "$first" "$second"
((most_running == 1 && waited == 1)) || fail "-np 1: at most $most_running running, one waiting seen: $waited"

# A second server on the same port: refused, naming the address and --port.
"$mqlm" serve -m "$dir/tiny.gguf" --port "$port" >"$dir/second.out" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -qF "127.0.0.1:$port" "$dir/second.out" && grep -q -- "--port" "$dir/second.out" ||
  fail "a second server on port $port: exit $rc, wanted 1 naming the address and --port" "$dir/second.out"
stop_server || fail "the server did not stop cleanly"

# ZeroMQ with --listen, and then no HTTP; its requests are logged too.
zmq="tcp://127.0.0.1:$(free_port)"
"$mqlm" --log-level info serve -m "$dir/tiny.gguf" --listen "$zmq" --insecure >"$dir/zmq.log" 2>&1 &
server_pid=$!
for _ in $(seq 120); do "$mqlm" client --server "$zmq" --status --timeout-ms 1000 >/dev/null 2>&1 && break; sleep 0.5; done
"$mqlm" client --server "$zmq" -p "Once upon a time" -n 4 --temperature 0 >/dev/null 2>"$dir/client.err" ||
  fail "a ZeroMQ request" "$dir/client.err" "$dir/zmq.log"
grep -qx "ready: listening on $zmq" "$dir/zmq.log" || fail "--listen alone served more than ZeroMQ" "$dir/zmq.log"
grep -qE "request done: id=gateway-[0-9]+ model=default prompt_tokens=[0-9]+ cached_tokens=[0-9]+ completion_tokens=4 .* finish=length$" \
  "$dir/zmq.log" || fail "no request line for the ZeroMQ request" "$dir/zmq.log"

# A second server on the same ZeroMQ address: refused, naming it and --listen.
"$mqlm" serve -m "$dir/tiny.gguf" --listen "$zmq" --insecure >"$dir/second-zmq.out" 2>&1
rc=$?
[[ $rc -eq 1 ]] && grep -qF "$zmq" "$dir/second-zmq.out" && grep -q -- "--listen" "$dir/second-zmq.out" ||
  fail "a second server at $zmq: exit $rc, wanted 1 naming the address and --listen" "$dir/second-zmq.out"
kill -TERM "$server_pid" && wait "$server_pid" || fail "the ZeroMQ server did not stop cleanly" "$dir/zmq.log"
server_pid=""

end_checks "all serve flag checks passed"
