#!/usr/bin/env bash
# One architecture served end to end: `mqlm make-model --arch ARCH` (gemma's with a sliding window
# of 8, which the prompt runs far past), `mqlm generate` from it, `mqlm serve` of it and `mqlm client`
# asking for greedy text twice (the same text both times), then SIGTERM. The mixtures of experts
# (qwen3moe; mixtral: llama with 8 experts) are also asked four requests at once, two of them the
# first's prompt, which continuous batching runs together and the prefix cache partly answers.
# Usage: serve_arch_test.sh MQLM_BINARY WORK_DIR ARCH
set -uo pipefail
mqlm=$1
dir=$2
arch=$3
mkdir -p "$dir"
source "$(dirname "${BASH_SOURCE[0]}")/../checks.sh"
trap '[[ -n $server_pid ]] && kill -KILL "$server_pid" 2>/dev/null' EXIT

options=(--arch "$arch")
[[ $arch == gemma* ]] && options+=(--sliding-window 8)
[[ $arch == mixtral ]] && options=(--arch llama --experts 8)
experts=false
[[ $arch == qwen3moe || $arch == mixtral ]] && experts=true
"$mqlm" make-model --preset tiny "${options[@]}" --type f16 -o "$dir/$arch.gguf" >"$dir/make.log" 2>&1 ||
  { fail "make the $arch model" "$dir/make.log"; exit 1; }
grep -q ": ${options[1]} " "$dir/make.log" || fail "make-model's summary names another architecture" "$dir/make.log"
! $experts || grep -q "8 experts of [0-9]*, 2 a token" "$dir/make.log" || fail "make-model's summary has no experts" "$dir/make.log"

prompt="Once upon a time, in a land far away, there lived a small model that read every word of a long story"
"$mqlm" generate "$dir/$arch.gguf" -p "$prompt" -n 16 --temperature 0 >"$dir/generate.out" 2>"$dir/generate.err" ||
  fail "mqlm generate from the $arch model" "$dir/generate.out" "$dir/generate.err"

start_zmq_server "$mqlm" "$dir/$arch.gguf" "$dir" --log-level info || exit 1
for run in 1 2; do
  "$mqlm" client --server "$server" -p "$prompt" -n 16 --temperature 0 >"$dir/client$run.out" 2>"$dir/client$run.err" ||
    fail "mqlm client (run $run) against the $arch model" "$dir/client$run.out" "$dir/client$run.err" "$dir/serve.log"
  grep -qE '^finish: (stop|length)' "$dir/client$run.err" || fail "no summary (run $run)" "$dir/client$run.err"
done
[[ -n $(tr -d '[:space:]' <"$dir/client1.out") ]] || fail "the $arch model served no text" "$dir/client1.out"
cmp -s "$dir/client1.out" "$dir/client2.out" || fail "greedy text differs between two requests" "$dir/client1.out" "$dir/client2.out"
if $experts; then
  prompts=("$prompt" "$prompt" "A different story begins here, with other words" "Numbers: 1 2 3 4 5 6 7 8 9")
  pids=()
  for i in 0 1 2 3; do
    "$mqlm" client --server "$server" -p "${prompts[$i]}" -n 16 --temperature 0 >"$dir/batch$i.out" 2>"$dir/batch$i.err" &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    wait "${pids[$i]}" || fail "concurrent request $i against the $arch model" "$dir/batch$i.err" "$dir/serve.log"
    [[ -n $(tr -d '[:space:]' <"$dir/batch$i.out") ]] || fail "concurrent request $i got no text" "$dir/batch$i.out"
  done
  for i in 0 1; do
    cmp -s "$dir/client1.out" "$dir/batch$i.out" ||
      fail "greedy text of the first prompt differs when batched (request $i)" "$dir/client1.out" "$dir/batch$i.out"
  done
  grep -qE "request done: .* cached_tokens=[1-9]" "$dir/serve.log" ||
    fail "no request of the $arch model was answered from the prefix cache" "$dir/serve.log"
fi
stop_zmq_server "$dir"

end_checks "the $arch model is served"
