#!/usr/bin/env bash
# Greedy output of one request alone against the same request among BATCH-1 others, on a running
# `mqlm serve`: on the GPU alone decodes through the vector matmuls, batched through the tensor-core
# ones, so this checks the batched path end to end where the tests (lavapipe) cannot.
# Usage: bench/check-batched-greedy.sh SERVER [BATCH] [TOKENS]; prints how many batched outputs
# equal the lone one, and the first token where the others part from it with how far apart the lone
# request's two likeliest tokens were there: random-weight models have near ties everywhere (a few
# hundredths of a logprob), where the two paths' roundings may pick differently; a wrong result
# would part at the first token, whatever the gap.
set -euo pipefail
server=$1 batch=${2:-16} n=${3:-32}
work=$(mktemp -d)
client() { mqlm client --server "$server" --json --temperature 0 -n "$n" "$@"; }
tokens() { grep -o '"tokens":\[[0-9,]*\]' | tr -dc '0-9,\n' | paste -sd, -; }  # the events' token ids, joined
ask() { client -p "$1" | tokens; }
prompt="The quick brown fox jumps over the lazy dog and then"
client -p "$prompt" --logprobs --top-logprobs 2 >"$work/alone.json"
tokens <"$work/alone.json" >"$work/alone"
for i in $(seq 1 "$batch"); do ask "$prompt" >"$work/b$i" & done
wait
same=0
for i in $(seq 1 "$batch"); do
  if cmp -s "$work/alone" "$work/b$i"; then
    same=$((same + 1))
  else
    python3 - "$work/alone" "$work/b$i" "$work/alone.json" <<'PY' 2>/dev/null || echo "request $i differs"
import json, sys
a, b = ([t for t in open(f).read().strip().split(",") if t] for f in sys.argv[1:3])  # the final event's [] adds a ","
first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
steps = [lp for line in open(sys.argv[3]) for lp in json.loads(line).get("logprobs", [])]
gap = ""
if first < len(steps) and len(steps[first].get("top", [])) >= 2:
    top = steps[first]["top"]
    gap = f" (the lone request's two likeliest there {top[0][1] - top[1][1]:.4f} apart)"
print(f"request differs from token {first} of {len(a)}{gap}")
PY
  fi
done
echo "batched greedy: $same of $batch equal the lone request ($n tokens)"
rm -rf "$work"
