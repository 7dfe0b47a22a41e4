# Sourced by tests/checks.sh and tests/actors/http/http_server.sh: stop_process PID sends SIGTERM
# and waits up to 10 s for PID (a child of this shell) to end. Returns 1 if it still runs; else 0,
# its exit status in stopped_rc.
stop_process() {
  local pid=$1
  kill -TERM "$pid"
  for _ in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && return 1
  wait "$pid"
  stopped_rc=$?
  return 0
}
