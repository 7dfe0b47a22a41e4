#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
A=.devrun/bin/mqlm-new
log=$OUT/grammar.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } | tee -a $log
[ -f /tmp/q4_0.gguf ] || $A make-model --preset llama3-8b --type q4_0 --pure -o /tmp/q4_0.gguf >/dev/null 2>&1
$A serve /tmp/q4_0.gguf --port 8089 > $OUT/serve.log 2>&1 &
pid=$!
for i in $(seq 120); do curl -sf localhost:8089/health >/dev/null 2>&1 && break; sleep 0.5; done
python3 .devrun/grammar_load.py http://127.0.0.1:8089 plain 32 10 q4_0 >/dev/null
python3 .devrun/grammar_load.py http://127.0.0.1:8089 json_object 32 10 q4_0 >/dev/null
for m in plain json_object plain json_object; do
  python3 .devrun/grammar_load.py http://127.0.0.1:8089 $m 32 40 q4_0 | tee -a $log
done
kill -TERM $pid; wait $pid
tail -3 $OUT/serve.log
