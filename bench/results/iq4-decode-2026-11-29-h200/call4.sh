#!/usr/bin/env bash
# Call 4: Q4_0 and Q8_0 decode products on pre-quantized activations reading a whole block a thread
# (b5) against bfc2316 (b3, quarter blocks), pure files and llama-quantize's mixtures, rounds
# alternated; and a decode batch of 8 (generate --batch 8).
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/gen.txt
M=/tmp/m; mkdir -p $M
mk() { [ -f $M/$1.gguf ] || .devrun/bin/mqlm-b3 make-model --preset llama3-8b --type $2 ${3:-} -o $M/$1.gguf >> $OUT/gen.txt; }
mk q4_0-pure q4_0 --pure; mk q8_0-pure q8_0 --pure; mk q4_0 q4_0; mk q8_0 q8_0
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
run() {
  local bin=$1 f=$2; shift 2
  local r; r=$(.devrun/bin/$bin generate $M/$f.gguf -p "$P" -n 128 --temperature 0 --warmup -q "$@" 2>&1 | grep -E "^(prefill|decode)|tok" | tr '\n' ' ')
  echo "$bin $f $* : $r" >> $OUT/gen.txt
}
.devrun/bin/mqlm-b3 generate $M/q4_0-pure.gguf -p "$P" -n 32 --temperature 0 -q > /dev/null 2>&1
for round in 1 2; do for bin in mqlm-b3 mqlm-b5; do for f in q4_0-pure q8_0-pure q4_0 q8_0; do run $bin $f; done; done; done
for bin in mqlm-b3 mqlm-b5; do run $bin q4_0-pure --batch 8; run $bin q8_0-pure --batch 8; done
.devrun/bin/mqlm-b5 bench kernels --preset llama3-8b --tokens 1,8 --types q4_0,q8_0 --matmul-only --out $OUT/kernels-b5.md > /dev/null 2>&1
.devrun/bin/mqlm-b3 bench kernels --preset llama3-8b --tokens 1,8 --types q4_0,q8_0 --matmul-only --out $OUT/kernels-b3.md > /dev/null 2>&1
cat $OUT/gen.txt
