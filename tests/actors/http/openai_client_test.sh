#!/usr/bin/env bash
# The official `openai` npm package against a real `mqlm serve --http` of the tiny model, with
# node's built-in test runner (node/TEST_FILE: openai_client.test.mjs unless given, or
# structured_output.test.mjs). The packages come from npm_ci.sh (the ctest fixture http.npm_ci)
# in NODE_DIR; the test files are copied beside them so that their import of 'openai' resolves there.
# Usage: openai_client_test.sh MQLM_BINARY NODE_SRC_DIR NODE_DIR WORK_DIR [TEST_FILE]
set -uo pipefail
mqlm=$1
node_src=$2
node_dir=$3
dir=$4
test_file=${5:-openai_client.test.mjs}
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"

[[ -d $node_dir/node_modules/openai ]] || { echo "no openai package in $node_dir: run the http.npm_ci test first"; exit 1; }
cp "$node_src"/*.test.mjs "$node_dir/"
start_server || exit 1
MQLM_HTTP_URL=$http_url MQLM_API_KEY=$api_key MQLM_MODEL=tiny node --test "$node_dir/$test_file"
rc=$?
stop_server || rc=1
exit $rc
