#!/usr/bin/env bash
# The kernel benchmark on the H100, in one command.
#
# Here (build machine), once per change:
#   cmake -B build-gpu -G Ninja && cmake --build build-gpu --target mqlm
#   bench/run-kernels-on-h100.sh pack          # bundles build-gpu/mqlm into .devrun (git-ignored)
# On the H100 (send .devrun along; $OUT comes back):
#   bench/run-kernels-on-h100.sh
# writes $OUT/kernels-h100.md (the table with date, device, driver and command; copy it to
# bench/results/kernels-<date>.md) and $OUT/kernels-h100.log (progress, one row per line, so a
# run cut short still shows what it measured).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ${1:-} == pack ]]; then
  ../shared/tools/devpack -o .devrun build-gpu/mqlm  # .devrun is in .gitignore
  strip .devrun/bin/mqlm                              # debug info would crowd the 64 MiB sent along
  du -sh .devrun
  exit 0
fi

: "${OUT:?set OUT to the folder the results go to}"
[[ -f .devrun/env.sh ]] || { echo "no .devrun here: run '$0 pack' on the build machine and send .devrun along" >&2; exit 2; }
# shellcheck disable=SC1091
source .devrun/env.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null || true; } \
  > "$OUT/nvidia-smi.txt"
# Stay inside the machine's 10-minute command limit; the log keeps whatever was measured.
timeout 540 mqlm --log-level info bench kernels --tokens 1,8,32,512 --types q4_0,q8_0,f16,q4_k,bf16,f32 \
  --out "$OUT/kernels-h100.md" 2> >(tee "$OUT/kernels-h100.log" >&2)
