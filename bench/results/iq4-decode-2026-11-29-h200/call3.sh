#!/usr/bin/env bash
# Call 3: IQ4_XS's header and quants as 8-byte loads (b3) against 7373a06 (b2), rounds alternated; and
# the coopmat2 probe kernel (branch coopmat2, built with Debian 13's glslc) in bench kernels, F16.
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/gen.txt
M=/tmp/m; mkdir -p $M
[ -f $M/iq4_xs.gguf ] || .devrun/bin/mqlm-b2 make-model --preset llama3-8b --type iq4_xs -o $M/iq4_xs.gguf >> $OUT/gen.txt
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
run() {
  local bin=$1 f=$2; shift 2
  local r; r=$(.devrun/bin/$bin generate $M/$f.gguf -p "$P" -n 128 --temperature 0 --warmup -q "$@" 2>&1 | grep -o "decode: .*tokens/s," | tr '\n' ' ')
  echo "$bin $f $* : $r" >> $OUT/gen.txt
}
.devrun/bin/mqlm-b2 generate $M/iq4_xs.gguf -p "$P" -n 32 --temperature 0 -q > /dev/null 2>&1
for round in 1 2 3; do for bin in mqlm-b2 mqlm-b3; do run $bin iq4_xs; done; done
.devrun/bin/mqlm-b3 bench kernels --preset llama3-8b --tokens 1 --types iq4_xs --matmul-only --out $OUT/kernels-b3.md > /dev/null 2>&1
timeout 200 .devrun/bin/mqlm-cm2 bench kernels --preset llama3-8b --staged-only --tokens 512 --types f16 --out $OUT/coopmat2.md > $OUT/coopmat2.log 2>&1
cat $OUT/gen.txt; tail -5 $OUT/coopmat2.log
