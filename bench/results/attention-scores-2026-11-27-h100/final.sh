#!/usr/bin/env bash
# Where this build's greedy tokens part from the build before's (602-token prompt: the two likeliest
# tokens at each step, both builds), then the issue's serving measurement on this build.
cd "$(dirname "$0")/.."
for f in .devrun/bin/*.xz; do xz -d "$f"; done; chmod +x .devrun/bin/*
source .devrun/env.sh >/dev/null 2>&1 || true
B=.devrun/bin
$B/mqlm make-model --preset llama3-8b --type q4_0 -o /tmp/m.gguf > /dev/null
p600=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..60})
for bin in mqlm mqlm-base; do
  $B/$bin generate /tmp/m.gguf -p "$p600" -n 16 --temperature 0 --logprobs --top-logprobs 2 --json 2>/dev/null > $OUT/top2-$bin.json
done
bench/run-serve-on-h100.sh
tail -12 $OUT/serve-h100.txt
