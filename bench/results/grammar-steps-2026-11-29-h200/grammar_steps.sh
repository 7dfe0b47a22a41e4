#!/usr/bin/env bash
# Constrained beside unconstrained decode steps at 32 concurrent requests (issue 34): each server
# binary in turn (.devrun/bin/mqlm-before, mqlm-after), sampled (0.8) and greedy, each run on a
# server of its own so that the executor's last line gives that run's GPU timeline (busy, idle
# queued, idle waiting for the host by what came late). Every request runs to max_tokens (the
# schema's list cannot close within 128 tokens; a random model's EOS is 1 in 128k), so both kinds
# do the same steps and TPOT is the time of a step. Then plain requests at 64 (sampled, greedy).
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
log=$OUT/grammar_steps.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee -a $log
.devrun/bin/mqlm-after make-model --preset llama3-8b --type q4_0 --pure -o /tmp/q4_0.gguf >/dev/null 2>&1
common=(--prompt-tokens 64 --output-tokens 128)
schema=.devrun/long_list.schema.json
n=0
for server in ${SERVERS:-mqlm-before mqlm-after}; do
  for run in "32 0.8 none" "32 0.8 $schema" "32 0.8 none" "32 0.8 $schema" "32 0 none" "32 0 $schema" \
             "64 0.8 none" "64 0 none"; do
    read -r concurrency temperature format <<< "$run"
    n=$((n+1))
    .devrun/bin/$server --log-level info serve /tmp/q4_0.gguf --listen tcp://127.0.0.1:5599 --insecure \
      > $OUT/serve-$n.txt 2>&1 &
    pid=$!
    for i in $(seq 600); do grep -q ready $OUT/serve-$n.txt && break; sleep 0.5; done
    flag=(); [ "$format" != none ] && flag=(--response-format "$format")
    echo "== run $n: server $server, concurrency $concurrency, temperature $temperature, response_format $format" \
      | tee -a $log
    .devrun/bin/mqlm-after bench serve --server tcp://127.0.0.1:5599 "${common[@]}" --temperature "$temperature" \
      --concurrency $concurrency --requests $((concurrency * 6)) --warmup $concurrency \
      "${flag[@]}" 2>&1 | grep -E "Successful|Failed|Output token|TPOT|ITL" | tee -a $log
    kill -TERM $pid; wait $pid
    grep -E "GPU submissions" $OUT/serve-$n.txt | tee -a $log
  done
done
