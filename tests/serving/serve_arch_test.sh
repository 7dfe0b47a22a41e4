#!/usr/bin/env bash
# One architecture served end to end: `mqlm make-model --arch ARCH` (gemma's with a sliding window
# of 8, which the prompt runs far past), `mqlm generate` from it, `mqlm serve` of it and `mqlm client`
# asking for greedy text twice (the same text both times), then SIGTERM.
# Usage: serve_arch_test.sh MQLM_BINARY WORK_DIR ARCH
set -uo pipefail
mqlm=$1
dir=$2
arch=$3
mkdir -p "$dir"
source "$(dirname "${BASH_SOURCE[0]}")/../checks.sh"
trap '[[ -n $server_pid ]] && kill -KILL "$server_pid" 2>/dev/null' EXIT

window=()
[[ $arch == gemma* ]] && window=(--sliding-window 8)
"$mqlm" make-model --preset tiny --arch "$arch" "${window[@]}" --type f16 -o "$dir/$arch.gguf" >"$dir/make.log" 2>&1 ||
  { fail "make the $arch model" "$dir/make.log"; exit 1; }
grep -q ": $arch " "$dir/make.log" || fail "make-model's summary names another architecture" "$dir/make.log"

prompt="Once upon a time, in a land far away, there lived a small model that read every word of a long story"
"$mqlm" generate "$dir/$arch.gguf" -p "$prompt" -n 16 --temperature 0 >"$dir/generate.out" 2>"$dir/generate.err" ||
  fail "mqlm generate from the $arch model" "$dir/generate.out" "$dir/generate.err"

start_zmq_server "$mqlm" "$dir/$arch.gguf" "$dir" || exit 1
for run in 1 2; do
  "$mqlm" client --server "$server" -p "$prompt" -n 16 --temperature 0 >"$dir/client$run.out" 2>"$dir/client$run.err" ||
    fail "mqlm client (run $run) against the $arch model" "$dir/client$run.out" "$dir/client$run.err" "$dir/serve.log"
  grep -qE '^finish: (stop|length)' "$dir/client$run.err" || fail "no summary (run $run)" "$dir/client$run.err"
done
[[ -n $(tr -d '[:space:]' <"$dir/client1.out") ]] || fail "the $arch model served no text" "$dir/client1.out"
cmp -s "$dir/client1.out" "$dir/client2.out" || fail "greedy text differs between two requests" "$dir/client1.out" "$dir/client2.out"
stop_zmq_server "$dir"

end_checks "the $arch model is served"
