#!/usr/bin/env bash
# The official `openai` npm package against a real `mqlm serve --http` of the tiny model, with
# node's built-in test runner (node/TEST_FILE: openai_client.test.mjs unless given, or
# structured_output.test.mjs). The packages come from npm_ci.sh (the ctest fixture http.npm_ci)
# in NODE_DIR; the test files are copied beside them so that their import of 'openai' resolves there.
# Further arguments go to `mqlm serve` (a --chat-template FILE); a file named there that does not
# exist (llama.cpp's templates come with the llama.cpp oracle) skips the test (77).
# Usage: openai_client_test.sh MQLM_BINARY NODE_SRC_DIR NODE_DIR WORK_DIR [TEST_FILE [SERVE ARGS...]]
set -uo pipefail
mqlm=$1
node_src=$2
node_dir=$3
dir=$4
test_file=${5:-openai_client.test.mjs}
serve_args=("${@:6}")
for ((i = 0; i + 1 < ${#serve_args[@]}; ++i)); do
  if [[ ${serve_args[i]} == --chat-template && ! -f ${serve_args[i + 1]} ]]; then
    echo "no chat template ${serve_args[i + 1]}: skipped"
    exit 77
  fi
done
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"

[[ -d $node_dir/node_modules/openai ]] || { echo "no openai package in $node_dir: run the http.npm_ci test first"; exit 1; }
cp "$node_src"/*.test.mjs "$node_dir/"
start_server "${serve_args[@]}" || exit 1
MQLM_HTTP_URL=$http_url MQLM_API_KEY=$api_key MQLM_MODEL=tiny node --test "$node_dir/$test_file"
rc=$?
stop_server || rc=1
exit $rc
