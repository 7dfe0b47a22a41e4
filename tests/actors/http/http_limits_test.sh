#!/usr/bin/env bash
# The HTTP layer against many, slow, hostile and vanishing clients (http_limits_test.py) through
# real sockets to a real `mqlm serve --http` of the tiny model with an API key; the server must
# stop cleanly after.
# Usage: http_limits_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"
# The client holds 1,000 connections: allowed as far as the hard limit goes.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

start_server || exit 1
/usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/http_limits_test.py" "${http_url##*:}" "$api_key" "$server_pid" ||
  failures=$((failures + 1))
stop_server || failures=$((failures + 1))
[[ $failures -eq 0 ]] || { tail -n 20 "$dir/serve.log"; exit 1; }
echo "http limits: all passed"
