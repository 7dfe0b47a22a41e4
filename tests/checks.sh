# Sourced by the shell tests that gather failures rather than stop at the first: fail DESCRIPTION
# [FILES TO SHOW...] counts one and shows the files' last lines; end_checks MESSAGE prints MESSAGE
# when none failed and exits 1 when any did.
source "$(dirname "${BASH_SOURCE[0]}")/stop_process.sh"
failures=0
fail() {
  echo "FAIL: $1"
  shift
  for f in "$@"; do [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }; done
  failures=$((failures + 1))
}
end_checks() {
  [[ $failures -eq 0 ]] && echo "$1"
  exit $((failures > 0))
}

# start_zmq_server MQLM MODEL DIR [OPTION...]: `mqlm OPTION... serve MODEL` without keys on a free TCP port of 127.0.0.1,
# its address in server and its pid in server_pid, its log DIR/serve.log; returns 0 once it answers
# a status request (DIR/status.json), else counts a failure and returns 1 (90 s: the model loads
# and the GPU pipelines are built first).
server_pid=""
start_zmq_server() {
  local mqlm=$1 model=$2 dir=$3 port
  local options=("${@:4}")  # global options before `serve` (--log-level info)
  # A port nobody listens on now (the kernel's choice, released at once).
  port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  server="tcp://127.0.0.1:$port"
  "$mqlm" "${options[@]}" serve "$model" --listen "$server" --insecure >"$dir/serve.log" 2>&1 &
  server_pid=$!
  local deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    "$mqlm" client --server "$server" --status --timeout-ms 1000 >"$dir/status.json" 2>"$dir/status.err" && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.5
  done
  fail "mqlm serve did not answer a status request within 90 s" "$dir/status.err" "$dir/serve.log"
  return 1
}

# stop_zmq_server DIR: SIGTERM drains and stops the server started by start_zmq_server, exit 0, within 10 s.
stop_zmq_server() {
  local dir=$1
  if ! stop_process "$server_pid"; then
    fail "mqlm serve still runs 10 s after SIGTERM" "$dir/serve.log"
    return
  fi
  server_pid=""
  [[ $stopped_rc -eq 0 ]] || fail "mqlm serve exited $stopped_rc after SIGTERM" "$dir/serve.log"
}
