# Sourced by the http tests: starts `mqlm serve --http` of the tiny model on free ports (or any
# server, start_server_at) and stops it with SIGTERM; fail and call for curl checks. Needs $mqlm
# and $dir; sets $http_url, $api_key, $server_pid, $failures, $auth and $json.

source "$(dirname "${BASH_SOURCE[0]}")/../../stop_process.sh"
api_key="test-key-$$"
server_pid=""
trap '[[ -n $server_pid ]] && kill -KILL "$server_pid" 2>/dev/null' EXIT

failures=0
fail() {  # fail DESCRIPTION: counts it, shows the last body
  echo "FAIL: $1"
  [[ -f $dir/body ]] && { echo "--- body"; head -c 2000 "$dir/body"; echo; }
  failures=$((failures + 1))
}
# call PATH [CURL ARGS...]: prints the HTTP status; the body is left in $dir/body.
call() {
  local path=$1
  shift
  curl -s -o "$dir/body" -w '%{http_code}' "$@" "$http_url$path"
}
auth=(-H "Authorization: Bearer $api_key")
json=(-H "Content-Type: application/json")

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server [EXTRA SERVE ARGS...]: returns 1 (after showing the log) if it is not healthy in 120 s.
start_server() {
  mkdir -p "$dir"
  if [[ ! -f $dir/tiny.gguf ]]; then
    "$mqlm" make-model --preset tiny --type f16 -o "$dir/tiny.gguf" >"$dir/make.log" 2>&1 ||
      { cat "$dir/make.log"; return 1; }
  fi
  local http_port gateway_port
  http_port=$(free_port)
  gateway_port=$(free_port)
  start_server_at "$http_port" serve "$dir/tiny.gguf" --http "127.0.0.1:$http_port" \
    --listen "tcp://127.0.0.1:$gateway_port" --insecure --api-key "$api_key" "$@"
}

# start_server_at PORT MQLM ARGS...: `$mqlm ARGS...` (its output in $dir/serve.log) answering
# /health on 127.0.0.1:PORT within 120 s, or 1 after showing the log.
start_server_at() {
  http_url="http://127.0.0.1:$1"
  shift
  "$mqlm" "$@" >"$dir/serve.log" 2>&1 &
  server_pid=$!
  local deadline=$((SECONDS + 120))
  while ((SECONDS < deadline)); do
    if [[ $(curl -s -o /dev/null -w '%{http_code}' "$http_url/health") == 200 ]]; then return 0; fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.5
  done
  echo "mqlm $* did not become healthy"
  tail -n 40 "$dir/serve.log"
  return 1
}

# stop_server: SIGTERM drains and stops within 10 s with exit 0, or it returns 1.
stop_server() {
  if ! stop_process "$server_pid"; then
    echo "mqlm serve still runs 10 s after SIGTERM"
    tail -n 40 "$dir/serve.log"
    return 1
  fi
  server_pid=""
  if [[ $stopped_rc -ne 0 ]]; then
    echo "mqlm serve exited $stopped_rc after SIGTERM"
    tail -n 40 "$dir/serve.log"
    return 1
  fi
}
