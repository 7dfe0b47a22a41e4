#!/usr/bin/env bash
# The serving protocol's clients against a real server: `mqlm serve` of the tiny model, asked by
# `mqlm client`, examples/python_client.py and `mqlm bench serve`, then stopped with SIGTERM.
# Usage: serve_cli_test.sh MQLM_BINARY WORK_DIR
set -uo pipefail
mqlm=$1
dir=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$dir"
source "$(dirname "${BASH_SOURCE[0]}")/../checks.sh"

trap '[[ -n $server_pid ]] && kill -KILL "$server_pid" 2>/dev/null' EXIT

"$mqlm" make-model --preset tiny --type f16 -o "$dir/tiny.gguf" >"$dir/make.log" 2>&1 ||
  { fail "make the tiny model" "$dir/make.log"; exit 1; }

start_zmq_server "$mqlm" "$dir/tiny.gguf" "$dir" || exit 1
grep -q '"models"' "$dir/status.json" || fail "the status lists no models" "$dir/status.json"

# Greedy text, streamed, with the summary on stderr.
"$mqlm" client --server "$server" -p "Once upon a time" -n 16 --temperature 0 >"$dir/client.out" 2>"$dir/client.err"
rc=$?
[[ $rc -eq 0 ]] || fail "mqlm client exited $rc" "$dir/client.out" "$dir/client.err" "$dir/serve.log"
[[ -n $(tr -d '[:space:]' <"$dir/client.out") ]] || fail "mqlm client printed no text" "$dir/client.out" "$dir/client.err"
grep -qE '^finish: (stop|length)' "$dir/client.err" || fail "mqlm client printed no summary" "$dir/client.err"

# The same request again, every event a JSON line, the last one the final.
"$mqlm" client --server "$server" -p "Once upon a time" -n 16 --temperature 0 --json >"$dir/client.jsonl" 2>&1 ||
  fail "mqlm client --json failed" "$dir/client.jsonl"
/usr/bin/python3 -c '
import json, sys
events = [json.loads(line) for line in open(sys.argv[1])]
assert events and events[-1]["event"] == "final", events[-1:]
' "$dir/client.jsonl" || fail "mqlm client --json did not print JSON events ending with the final" "$dir/client.jsonl"

# A prompt of token ids.
"$mqlm" client --server "$server" --tokens 1,2,3 -n 4 --temperature 0 >"$dir/tokens.out" 2>"$dir/tokens.err" ||
  fail "mqlm client --tokens failed" "$dir/tokens.out" "$dir/tokens.err"
grep -qE '^finish: (stop|length)' "$dir/tokens.err" || fail "mqlm client --tokens printed no summary" "$dir/tokens.err"

# Flags that make no request.
"$mqlm" client --server "$server" -p "Hello" --tokens 1,2 >"$dir/bad.out" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "two prompts: exit $rc, wanted 2" "$dir/bad.out"

# A client in another language.
/usr/bin/python3 "$root/examples/python_client.py" --server "$server" --prompt "Once upon a time" --max-tokens 16 \
  --temperature 0 >"$dir/python.out" 2>"$dir/python.err"
rc=$?
[[ $rc -eq 0 ]] || fail "python_client.py exited $rc" "$dir/python.out" "$dir/python.err"
[[ -n $(tr -d '[:space:]' <"$dir/python.out") ]] || fail "python_client.py printed no text" "$dir/python.err"

# The benchmark: every request completes and tokens come out.
"$mqlm" bench serve --server "$server" --requests 20 --concurrency 4 --output-tokens 8 --json "$dir/bench.json" \
  >"$dir/bench.out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || fail "mqlm bench serve exited $rc" "$dir/bench.out" "$dir/serve.log"
/usr/bin/python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["completed"] == 20, r["completed"]
assert r["output_throughput"] > 0, r["output_throughput"]
' "$dir/bench.json" || fail "bench.json lacks 20 completed requests or output throughput" "$dir/bench.json"

stop_zmq_server "$dir"

end_checks "all serving client checks passed"
