#!/usr/bin/env bash
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
source .devrun/env.sh || true
mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/q4.gguf > /dev/null
mqlm make-model --preset llama3-8b --type f16 -o /tmp/f16.gguf > /dev/null
L=tcp://127.0.0.1:5555
mqlm --log-level info serve --model q4=/tmp/q4.gguf --model f16=/tmp/f16.gguf --ttl 3 --listen $L --kv-pages 2048 --max-sequences 8 > $OUT/serve.out 2> $OUT/serve.log &
server=$!
for i in $(seq 1 200); do grep -q ready $OUT/serve.out 2>/dev/null && break; sleep 0.5; done
B="mqlm bench serve --server $L --requests 4 --concurrency 1 --prompt-tokens 128 --output-tokens 128 --warmup 1"
run() { echo "$1: $($B --model $2 --seed $3 2>&1 | grep -E 'Output token throughput')"; }
run "q4 fresh" q4 1; run "q4 again" q4 2
sleep 8; echo "status: $(mqlm client --server $L --status 2>&1 | tr '\n' ' ' | cut -c1-400)"
run "f16" f16 3
sleep 8; echo "status: $(mqlm client --server $L --status 2>&1 | tr '\n' ' ' | cut -c1-400)"
run "q4 after f16 was loaded and unloaded" q4 4; run "q4 again" q4 5
kill $server; wait $server 2>/dev/null
grep -iE "unload|evict|loaded|trim" $OUT/serve.log | cut -c1-200 | tail -12
