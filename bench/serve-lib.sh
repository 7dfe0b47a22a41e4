# Sourced by the bench scripts that time a server: start_server LOG ARGS... runs `mqlm --log-level
# info serve ARGS...` in the background (stdout to $OUT/serve-stdout.txt, stderr to
# $OUT/serve-log.txt), logs the command to LOG, stops it when the script exits, and returns once it
# says ready; a server that ends first has its log appended to LOG and ends the script. Its pid is
# in $server.
start_server() {
  local log=$1
  shift
  echo "server: mqlm serve $*" >>"$log"
  mqlm --log-level info serve "$@" >"$OUT/serve-stdout.txt" 2>"$OUT/serve-log.txt" &
  server=$!
  trap 'kill $server 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    grep -q ready "$OUT/serve-stdout.txt" 2>/dev/null && return 0
    kill -0 $server 2>/dev/null || { echo "mqlm serve ended before it was ready" >>"$log"; cat "$OUT/serve-log.txt" >>"$log"; exit 1; }
    sleep 0.5
  done
}
