#!/usr/bin/env bash
# Constrained beside unconstrained decode steps at 32 concurrent requests (issue 34), each server
# binary in turn: .devrun/bin/mqlm-before (constrained steps not chained) and mqlm-after.
# Every request runs to max_tokens (the schema's list cannot close within 128 tokens; a random
# model's EOS is 1 in 128k), so both kinds do the same steps; TPOT is the time per step.
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/grammar_steps.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee -a $log
B=.devrun/bin/mqlm-after
$B make-model --preset llama3-8b --type q4_0 --pure -o /tmp/q4_0.gguf >/dev/null 2>&1
common=(--concurrency 32 --requests 192 --warmup 32 --prompt-tokens 64 --output-tokens 128 --temperature 0.8)
for server in ${SERVERS:-mqlm-before mqlm-after}; do
  .devrun/bin/$server serve /tmp/q4_0.gguf --listen tcp://127.0.0.1:5599 --insecure > $OUT/serve-$server.txt 2>&1 &
  pid=$!
  for i in $(seq 600); do grep -q ready $OUT/serve-$server.txt && break; sleep 0.5; done
  for format in none .devrun/long_list.schema.json none .devrun/long_list.schema.json; do
    flag=(); [ "$format" != none ] && flag=(--response-format "$format")
    echo "== server $server, response_format $format" | tee -a $log
    $B bench serve --server tcp://127.0.0.1:5599 "${common[@]}" "${flag[@]}" 2>&1 \
      | grep -E "Sampling|Successful|Failed|Ended before|Output token|TPOT|ITL" | tee -a $log
  done
  kill -TERM $pid; wait $pid
done
