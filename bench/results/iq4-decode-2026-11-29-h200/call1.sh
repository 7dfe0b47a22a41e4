#!/usr/bin/env bash
# Call 1: IQ4_XS decode, two builds (b0 = ee455eb, b1 = b0 + the byte-moves lookup and no activation
# sums for IQ4) x the decode products' workgroup shapes, in the model (`generate --matvec-shape`)
# and in `bench kernels`; Q4_K_M beside it (its Q5_K / Q6_K take the same kernel).
set -uo pipefail
source .devrun/env.sh >/dev/null 2>&1 || true
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/*
{ date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > $OUT/gen.txt
M=/tmp/m; mkdir -p $M
for t in iq4_xs q4_k_m; do .devrun/bin/mqlm-b0 make-model --preset llama3-8b --type $t -o $M/$t.gguf >> $OUT/gen.txt; done
P=$(printf 'The quick brown fox jumps over the lazy dog. %.0s' {1..51})
run() {
  local bin=$1 f=$2; shift 2
  local r; r=$(.devrun/bin/$bin generate $M/$f.gguf -p "$P" -n 128 --temperature 0 --warmup -q "$@" 2>&1 | tr '\n' ' ')
  echo "$bin $f $* : $r" >> $OUT/gen.txt
}
.devrun/bin/mqlm-b0 generate $M/iq4_xs.gguf -p "$P" -n 32 --temperature 0 -q > /dev/null 2>&1
for round in 1 2; do
  for bin in mqlm-b0 mqlm-b1; do
    for s in "" 64x4 32x4 128x8 64x8; do run $bin iq4_xs ${s:+--matvec-shape $s}; done
    for s in "" 64x4; do run $bin q4_k_m ${s:+--matvec-shape $s}; done
  done
done
for bin in mqlm-b0 mqlm-b1; do
  for s in "" 64x4; do
    echo "== profile $bin iq4_xs $s" >> $OUT/profile.txt
    .devrun/bin/$bin generate $M/iq4_xs.gguf -p "$P" -n 64 --temperature 0 --warmup --profile ${s:+--matvec-shape $s} 2>&1 | tail -24 >> $OUT/profile.txt
  done
  .devrun/bin/$bin bench kernels --preset llama3-8b --tokens 1 --types iq4_xs --matmul-only --out $OUT/kernels-$bin.md > /dev/null 2>&1
  .devrun/bin/$bin bench kernels --preset llama3-8b --tokens 1 --types iq4_xs --matmul-only --matvec-shape 64x4 --out $OUT/kernels-$bin-64x4.md > /dev/null 2>&1
done
cat $OUT/gen.txt
