#!/usr/bin/env bash
# A fuzzer's long run, for the record (bench/results/fuzz-*.md), not for ctest: TARGET's fuzzer
# runs as JOBS processes side by side on one shared corpus until they have executed RUNS inputs
# together (each process RUNS / JOBS, with a seed of its own) or SECONDS have passed. Its seeder
# writes fresh seeds first. Prints each process's final stats and the sum; exits non-zero if any
# process found something (a crash, leak, UB report, timeout, or RSS / malloc over the limits),
# leaving the input in WORK/TARGET/artifacts.
#
# Usage: long_run.sh FUZZ_BUILD_DIR TARGET WORK [RUNS=10000000] [JOBS=1] [SECONDS=540]
#   FUZZ_BUILD_DIR holds mqlm_TARGET_fuzzer and mqlm_TARGET_fuzz_seeds (build/tests/fuzz/clang).
set -uo pipefail
bin=$1 target=$2 work=$3 runs=${4:-10000000} jobs=${5:-1} seconds=${6:-540}
dir=$work/$target
mkdir -p "$dir/corpus" "$dir/artifacts"
"$bin/mqlm_${target}_fuzz_seeds" "$dir/seeds" >/dev/null || { echo "$target: the seeder failed"; exit 1; }
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
per_job=$(( (runs + jobs - 1) / jobs ))
pids=()
for ((j = 0; j < jobs; j++)); do
  # The first process also reads the seeds; the others start from what the corpus holds by then.
  inputs=("$dir/corpus"); ((j == 0)) && inputs+=("$dir/seeds")
  "$bin/mqlm_${target}_fuzzer" "${inputs[@]}" -seed=$((j + 1)) -runs="$per_job" -max_total_time="$seconds" \
    -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=512 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/" >"$dir/job$j.log" 2>&1 &
  pids+=($!)
  ((j == 0)) && sleep 5
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
total=0
for ((j = 0; j < jobs; j++)); do
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$dir/job$j.log" |
    tr '\n' ' ' | sed "s/^/$target job $j: /"; echo
  n=$(awk '/^stat::number_of_executed_units/ {print $2}' "$dir/job$j.log")
  total=$((total + ${n:-0}))
  grep -m1 -E '^#[0-9]+[[:space:]]+DONE[[:space:]]+cov' "$dir/job$j.log" | sed "s/^/$target job $j end: /"
done
echo "$target: $total executions in all, corpus $(ls "$dir/corpus" | wc -l) files ($(du -sk "$dir/corpus" | cut -f1) KiB)"
if ((failed)); then
  echo "$target: a process found something; its log's end:"
  for ((j = 0; j < jobs; j++)); do tail -n 30 "$dir/job$j.log"; done
fi
exit $failed
