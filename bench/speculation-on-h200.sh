#!/usr/bin/env bash
# Speculative decoding by prompt lookup (`mqlm serve --speculate ngram`) against none, the same file,
# one call: `mqlm bench serve` at concurrency 1, greedy (random-id prompts; a text prompt; a prompt
# that is one random run of 64 ids eight times over, issue 35's "prompt whose answer repeats it":
# random weights loop, and the lookup guesses from the prompt and the loop) and sampled (the same
# repeating prompt at temperature 0.7: the rejection rule), and at 32 (where --speculate-max-batch
# turns drafting off: issue 35's at most 5% cost); the drafted and accepted counters from /metrics
# after each run. Compare each run's TPOT and output tok/s with speculation none. The file: the llama3-8b preset in F16
# (issue 35's figure), or PRESET / TYPE. Writes $OUT/speculation.txt and a JSON per run.
# Here: ../shared/tools/devpack -o .devrun build/mqlm. There (carry .devrun): bench/speculation-on-h200.sh
# Knobs: DRAFTS (--draft-max values; "4 8"), OUTPUT_TOKENS (256), PRESET, TYPE.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/* 2>/dev/null || true
source .devrun/env.sh || true
log=$OUT/speculation.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >>"$log"
model=/tmp/spec-${PRESET:-llama3-8b}-${TYPE:-f16}.gguf
[ -f "$model" ] || mqlm make-model --preset "${PRESET:-llama3-8b}" --type "${TYPE:-f16}" --pure -o "$model" >>"$log"
listen=tcp://127.0.0.1:5556
source bench/serve-lib.sh
text=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..12})
n=${OUTPUT_TOKENS:-256}
for mode in none ${DRAFTS:-4 8}; do
  flags=(--speculate none)
  [ "$mode" != none ] && flags=(--speculate ngram --draft-max "$mode")
  start_server "$log" "$model" --name m --listen $listen --insecure --kv-pages 4096 --max-sequences 64 \
    --http 127.0.0.1:8091 "${flags[@]}"
  run() {  # label, temperature, then bench serve's arguments
    local label=$1 temperature=$2; shift 2
    local cmd=(mqlm bench serve --server $listen --model m --temperature "$temperature" --output-tokens "$n"
               --json "$OUT/spec-$mode-$label.json" "$@")
    echo "== speculate $mode | $label | ${cmd[*]}" >>"$log"
    "${cmd[@]}" >>"$log" 2>&1 || echo "failed" >>"$log"
    # The counters so far (they add up over the server's runs).
    python3 -c 'import urllib.request as u; print(u.urlopen("http://127.0.0.1:8091/metrics").read().decode())' |
      grep -E '^mqlm_scheduler_(drafted|accepted)_tokens_total' >>"$log" || true
  }
  run c1-random 0 --concurrency 1 --requests 4 --warmup 1 --prompt-tokens 128 --seed 1
  run c1-text 0 --concurrency 1 --requests 4 --warmup 1 --prompt "$text"
  run c1-repeat 0 --concurrency 1 --requests 4 --warmup 1 --prompt-tokens 512 --prompt-repeats 8 --seed 3
  run c1-repeat-t0.7 0.7 --concurrency 1 --requests 4 --warmup 1 --prompt-tokens 512 --prompt-repeats 8 --seed 3
  run c32-random 0 --concurrency 32 --requests 64 --warmup 32 --prompt-tokens 128 --seed 2
  kill -TERM $server; wait $server || true
  grep -iE 'drafted|accepted|speculat' "$OUT/serve-log.txt" | tail -3 >>"$log" || true
done
cat "$log"
