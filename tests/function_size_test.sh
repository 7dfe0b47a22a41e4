#!/usr/bin/env bash
# No function in the folders the forward pass, the scheduler and the executor live in is over 100
# lines (docs/architecture.md, "Layout"): clang-tidy's readability-function-size, which counts a
# function's lines from its first to its last, comments and blank lines included.
# usage: function_size_test.sh SOURCE_DIR BUILD_DIR (the one with compile_commands.json)
set -euo pipefail
src=$1 build=$2
limit=100
config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: $limit}]}"
cd "$src"
files=$(git ls-files 'model/*.cpp' 'gpu/*.cpp' 'actors/scheduler/*.cpp' 'actors/executor/*.cpp' 2>/dev/null ||
        find model gpu actors/scheduler actors/executor -name '*.cpp')
[ -n "$files" ] || { echo "no sources found under $src"; exit 1; }
report=$(printf '%s\n' $files | xargs -P 2 -n 4 clang-tidy -p "$build" --quiet \
           -checks='-*,readability-function-size' -config="$config" 2>/dev/null |
         grep -E 'warning: function|note: [0-9]+ lines' || true)
if [ -n "$report" ]; then
  echo "functions over $limit lines:"
  echo "$report"
  exit 1
fi
echo "$(echo $files | wc -w) files, no function over $limit lines"
