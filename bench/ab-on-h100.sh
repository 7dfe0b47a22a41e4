#!/usr/bin/env bash
# Builds against each other on one machine, in one command: every `mqlm` command line given runs
# with each build in turn, ROUNDS times over (alternated, so that a machine's drift falls on all of
# them alike), on a llama3-8b preset model made on the spot. Lent machines differ by up to 8% from
# one call to the next: compare builds only within one call. Writes $OUT/ab.txt.
#
# Here: pack the builds into .devrun/bin under names of their own, e.g.
#   ../shared/tools/devpack -o .devrun build/mqlm && cp /tmp/base/build/mqlm .devrun/bin/mqlm-base
#   strip .devrun/bin/* && xz -T2 -6 .devrun/bin/*      (the working tree and .devrun: 64 MiB at most)
# There (carry .devrun):
#   bench/ab-on-h100.sh 'generate $MODEL -p "$P600" -n 128 --temperature 0 --warmup -q' \
#                       'generate $MODEL -p "$P130" -n 128 --temperature 0 --batch 32 --warmup -q'
# Each command is a line of `mqlm` arguments (the binary left out) in single quotes; in it $MODEL is
# the model and $P130, $P600, $P2000 prompts of about that many tokens. Knobs: BUILDS (default
# "mqlm mqlm-base"), ROUNDS (3), TYPE (q4_0), PURE (1: every matrix TYPE; 0: llama-quantize's
# mixture for TYPE, e.g. q4_k_m), PRESET (llama3-8b), KEEP (a regular expression: the
# output lines kept; default the figures generate and bench print), ENVS (a space-separated list of
# VAR=VALUE settings: each build runs once per setting, to compare a switch within one build).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder the results go to}"
[ $# -gt 0 ] || { echo "usage: bench/ab-on-h100.sh 'MQLM ARGS' ['MQLM ARGS' ...]" >&2; exit 2; }
for f in .devrun/bin/*.xz; do [ -e "$f" ] && xz -d "$f"; done
chmod +x .devrun/bin/* 2>/dev/null || true
source .devrun/env.sh || true  # its last test fails where there is no NVIDIA driver
log=$OUT/ab.txt
{ date -u +"date: %Y-%m-%d %H:%M UTC"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true; } >"$log"
builds=${BUILDS:-mqlm mqlm-base}
for b in $builds; do
  [ -x ".devrun/bin/$b" ] || { echo "no build .devrun/bin/$b" | tee -a "$log" >&2; exit 2; }
done
first=${builds%% *}
export MODEL=/tmp/ab-model.gguf
".devrun/bin/$first" make-model --preset "${PRESET:-llama3-8b}" --type "${TYPE:-q4_0}" \
  $([ "${PURE:-1}" = 1 ] && echo --pure) -o "$MODEL" >>"$log"
sentence='The quick brown fox jumps over the lazy dog. '
P130=$(printf "$sentence%.0s" {1..13}) P600=$(printf "$sentence%.0s" {1..60}) P2000=$(printf "$sentence%.0s" {1..200})
export P130 P600 P2000
keep=${KEEP:-'^(prefill|decode)|tok/s|tokens/s|ms per step'}
settings=${ENVS:-"-"}
for round in $(seq 1 "${ROUNDS:-3}"); do
  for cmd in "$@"; do
    for b in $builds; do
      for setting in $settings; do
        label="$b"
        envs=()
        if [ "$setting" != "-" ]; then
          label="$b $setting"
          envs=("$setting")
        fi
        # The command line's own quoting and variables, as a shell would take them.
        figures=$(eval "env ${envs[*]:-} .devrun/bin/$b $cmd" 2>&1 | grep -E "$keep" | tr '\n' ' ' || true)
        echo "round $round | $label | $cmd | $figures" >>"$log"
      done
    done
  done
done
rm -f "$MODEL"
cat "$log"
