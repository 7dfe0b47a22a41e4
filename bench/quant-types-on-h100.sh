#!/usr/bin/env bash
# mqlm against llama.cpp's CUDA backend on the same files of every common quantization, in one call
# (or two back to back: every step skips what an earlier call on the same machine left done).
# The files: the llama3-8b preset written by `mqlm make-model --type T` in llama-quantize's mixture
# for file type T (its rule, checked tensor by tensor against llama_model_quantize by
# tests/model/gguf/quant_mixture_oracle_test.cpp), and pure Q4_0 / Q8_0 files (`--pure`) beside
# llama-quantize's Q4_0 / Q8_0 mixtures. mqlm: `generate -p <512 tokens> -n 128 --temperature 0
# --warmup -q`; llama.cpp: `llama-bench -p 512 -n 128 -fa 1`. Writes $OUT/quant-types.txt.
#
# Here: ../shared/tools/devpack -o .devrun build/mqlm && ../shared/tools/llamacpp-peer pack .devrun/peer
# There (carry .devrun): bench/quant-types-on-h100.sh [mqlm|llamacpp|kernels ...] (default: all
# three). Knobs: MQLM (the binary; default .devrun/bin/mqlm: another build's, to compare two in
# one call), TYPES (file types; default "q4_k_m q5_k_m q6_k iq4_xs q4_0 q8_0"), PURE ("q4_0
# q8_0"), ROUNDS (2), PRESET (llama3-8b; the files are named after it, so one call may run the
# script once per preset, building llama.cpp once), KERNEL_TYPES (the `bench kernels` rows).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/* 2>/dev/null || true
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
mqlm=${MQLM:-.devrun/bin/mqlm}
log=$OUT/quant-types.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >>"$log"
parts=${*:-mqlm llamacpp kernels}
types=${TYPES-q4_k_m q5_k_m q6_k iq4_xs q4_0 q8_0}
pure=${PURE-q4_0 q8_0}
preset=${PRESET:-llama3-8b}
models=/tmp/quant-types
mkdir -p "$models"

# llama.cpp builds on the CPU (about 4.5 minutes) while the models are made and mqlm measured; the
# build ends with the call, so the llamacpp part waits for it in the same call.
if [[ $parts == *llamacpp* && ! -x /tmp/llamacpp/bin/llama-bench ]]; then
  bash .devrun/peer/llamacpp-build.sh >/tmp/llamacpp-build.log 2>&1 &
  build=$!
fi

files=()
for t in $types; do
  f=$models/$preset-$t.gguf
  [[ -f $f ]] || "$mqlm" make-model --preset "$preset" --type "$t" -o "$f" | tee -a "$log"
  files+=("$f")
done
for t in $pure; do
  f=$models/$preset-$t-pure.gguf
  [[ -f $f ]] || "$mqlm" make-model --preset "$preset" --type "$t" --pure -o "$f" | tee -a "$log"
  files+=("$f")
done

sentence='The quick brown fox jumps over the lazy dog. '
P512=$(printf "$sentence%.0s" {1..51})
for part in $parts; do
  case $part in
    mqlm)
      # A freshly started machine runs its first process slower: one untimed run first.
      "$mqlm" generate "${files[0]}" -p "$P512" -n 32 --temperature 0 -q >/dev/null 2>&1 || true
      for round in $(seq 1 "${ROUNDS:-2}"); do
        for f in "${files[@]}"; do
          figures=$("$mqlm" generate "$f" -p "$P512" -n 128 --temperature 0 --warmup -q 2>&1 |
                    grep -E '^(prefill|decode)|tok/s' | tr '\n' ' ' || true)
          echo "$(basename "$mqlm") | round $round | $(basename "$f" .gguf) | $figures" | tee -a "$log"
        done
      done ;;
    llamacpp)
      if [[ -n ${build:-} ]] && ! wait "$build"; then
        echo "llama.cpp build failed:"
        tail -20 /tmp/llamacpp/build.log
        exit 1
      fi
      for f in "${files[@]}"; do
        echo "llama.cpp | $(basename "$f" .gguf)" >>"$log"
        /tmp/llamacpp/bin/llama-bench -m "$f" -p 512 -n 128 -fa 1 -r 3 -o md 2>/dev/null | grep -E '^\|' | tee -a "$log"
      done ;;
    kernels)
      "$mqlm" bench kernels --tokens "${KERNEL_TOKENS:-1,512}" --types "${KERNEL_TYPES:-q4_0,q4_k,q5_k,q6_k,iq4_xs}" \
        --out "$OUT/kernels.md" >/dev/null 2>&1 && echo "kernels: $OUT/kernels.md" | tee -a "$log" ;;
  esac
done
