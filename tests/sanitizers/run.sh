#!/usr/bin/env bash
# The sanitizer runs (issue 36), each in a build folder of its own beside build/:
#   run.sh asan [CTEST ARGS...]  build-asan: everything under ASan + UBSan, the whole suite
#   run.sh tsan [CTEST ARGS...]  build-tsan: what the actor runtime and serving tests need under
#                                TSan, those tests (ctest labels runtime and serving)
# Configures (MQLM_SANITIZE, fuzzers off: they have their own sanitizers), builds, runs ctest with
# the arguments given (-j2, -R REGEX), then prints every report the sanitizers wrote to
# BUILD/sanitizer-logs, where reports go so that one in a server process a test ends is seen too.
# Exits 1 if any test failed or any report was written. Suppressions: tests/sanitizers/*.supp.
set -euo pipefail
kind=${1:-}
shift || true
src=$(cd "$(dirname "$0")/../.." && pwd)
case $kind in
  asan) sanitize=address,undefined; targets=(all); select=() ;;
  tsan) sanitize=thread; targets=(mqlm actors_tests server_tests); select=(-L 'runtime|serving') ;;
  *) echo "usage: run.sh asan|tsan [ctest arguments...]" >&2; exit 2 ;;
esac
build=$src/build-$kind
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$src" -B "$build" -G Ninja "${launcher[@]}" -DMQLM_SANITIZE=$sanitize -DMQLM_FUZZ=OFF
cmake --build "$build" --target "${targets[@]}"

logs=$build/sanitizer-logs
rm -rf "$logs"
status=0
ctest --test-dir "$build" --output-on-failure "${select[@]}" "$@" || status=1
mapfile -t reports < <(find "$logs" -type f 2>/dev/null | sort)
for report in "${reports[@]}"; do
  echo "=== $report"
  cat "$report"
done
if ((${#reports[@]} > 0)); then
  echo "run.sh $kind: sanitizer reports from ${#reports[@]} process(es), in $logs"
  status=1
fi
((status == 0)) && echo "run.sh $kind: every test passed, no sanitizer reports"
exit $status
