#!/usr/bin/env bash
# API keys on both protocols against a real `mqlm serve` of the tiny model with --api-key and
# --admin-api-key: HTTP and ZeroMQ requests without a key are refused (401 / unauthorized), an
# ordinary key generates but may not load, unload or clear (403 / forbidden), an admin key may;
# and a server reachable beyond loopback without keys warns at start unless --insecure.
# Usage: api_keys_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"
admin_key="admin-$$"
start_server --admin-api-key "$admin_key" || exit 1
gateway=$(grep -o 'tcp://[0-9.:]*' "$dir/serve.log" | head -1)

# expect_http WANT DESCRIPTION PATH CURL ARGS...
expect_http() {
  local want=$1 what=$2
  shift 2
  local got
  got=$(call "$@")
  [[ $got == "$want" ]] || fail "HTTP $what: $got, wanted $want"
}
completion=(-X POST "${json[@]}" -d '{"model": "tiny", "prompt": "Once", "max_tokens": 2}')
expect_http 401 "a completion without a key" /v1/completions "${completion[@]}"
expect_http 200 "a completion with the key" /v1/completions "${auth[@]}" "${completion[@]}"
expect_http 200 "a completion with the admin key" /v1/completions -H "Authorization: Bearer $admin_key" \
  "${completion[@]}"
expect_http 403 "a load with the ordinary key" /api/models/tiny/load -X POST "${auth[@]}"
jq -e '.error.code == "forbidden"' "$dir/body" >/dev/null || fail "HTTP 403's code is not forbidden"
expect_http 403 "a hot cache clear with the ordinary key" /api/hot-cache/clear -X POST "${auth[@]}"
expect_http 401 "an unload without a key" /api/models/tiny/unload -X POST
expect_http 200 "a load with the admin key" /api/models/tiny/load -X POST -H "Authorization: Bearer $admin_key"
expect_http 200 "/ready without a key" /ready

# The ZeroMQ protocol, frame by frame.
/usr/bin/python3 - "$gateway" "$api_key" "$admin_key" <<'PY' || fail "the ZeroMQ checks"
import sys
import msgpack
import zmq

endpoint, key, admin = sys.argv[1:]
socket = zmq.Context().socket(zmq.DEALER)
socket.connect(endpoint)
failures = 0


def ask(frame):
    socket.send(msgpack.packb(frame))
    while True:
        if not socket.poll(10000):
            return {"event": "nothing in 10 s"}
        body = socket.recv()
        if body:  # an empty frame is a keepalive
            event = msgpack.unpackb(body)
            if event.get("event") != "token":
                return event


def expect(frame, check, what):
    global failures
    event = ask(frame)
    ok = check(event)
    print(("ok   " if ok else "FAIL ") + what + ("" if ok else f": {event}"))
    failures += 0 if ok else 1


def refused(code):
    # An error event carries the code; a generate's final carries it under "error".
    return lambda e: e.get("code") == code or (e.get("event") == "final" and e.get("error", {}).get("code") == code)



expect({"op": "unload", "model": "tiny"}, refused("unauthorized"), "an unload without a key is refused")
expect({"op": "unload", "model": "tiny", "api_key": "wrong"}, refused("unauthorized"), "an unload with a wrong key")
expect({"op": "unload", "model": "tiny", "api_key": key}, refused("forbidden"), "an unload with the ordinary key")
expect({"op": "clear_cache", "tier": "hot", "api_key": key}, refused("forbidden"), "a clear with the ordinary key")
expect({"op": "status"}, refused("unauthorized"), "a status without a key")
expect({"op": "generate", "id": 1, "prompt": "Once", "max_tokens": 2}, refused("unauthorized"),
       "a generate without a key ends with unauthorized")
expect({"op": "generate", "id": 2, "prompt": "Once", "max_tokens": 2, "api_key": key},
       lambda e: e.get("event") == "final" and e.get("finish_reason") in ("stop", "length"), "a generate with the key")
expect({"op": "models", "api_key": key}, lambda e: e.get("event") == "models", "models with the ordinary key")
expect({"op": "unload", "model": "tiny", "api_key": admin}, lambda e: e.get("event") == "model",
       "an unload with the admin key")
sys.exit(1 if failures else 0)
PY
"$mqlm" client --server "$gateway" --status >"$dir/client.log" 2>&1 && fail "mqlm client without the key succeeded"
grep -q unauthorized "$dir/client.log" || fail "mqlm client without the key does not say unauthorized"
MQLM_API_KEY=$api_key "$mqlm" client --server "$gateway" --status >"$dir/client.log" 2>&1 ||
  fail "mqlm client with MQLM_API_KEY failed: $(tail -2 "$dir/client.log")"
stop_server || failures=$((failures + 1))

# Beyond loopback without keys: a warning, unless --insecure.
for insecure in "" --insecure; do
  port=$(free_port)
  start_server_at "$port" serve "$dir/tiny.gguf" --http "0.0.0.0:$port" $insecure || { failures=$((failures + 1)); break; }
  if [[ -z $insecure ]]; then
    grep -q "WARNING: http://0.0.0.0:$port can be reached beyond this machine" "$dir/serve.log" ||
      fail "no warning for HTTP on 0.0.0.0 without keys"
  else
    grep -q WARNING "$dir/serve.log" && fail "a warning despite --insecure"
  fi
  stop_server || failures=$((failures + 1))
done
[[ $failures -eq 0 ]] || { tail -n 20 "$dir/serve.log"; exit 1; }
echo "api keys: all passed"
