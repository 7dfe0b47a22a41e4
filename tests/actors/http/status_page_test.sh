#!/usr/bin/env bash
# The status page at / in headless Chromium: a real `mqlm serve` of the demo model (sampling
# every 250 ms), then one with --api-key, each driven by status_page/status_page.test.mjs
# (playwright-core, from npm_ci.sh in NODE_DIR) while completions run. Exits 77 (ctest: skipped)
# when Debian's chromium is not installed; CI installs it (tools/install-deps.sh).
# Usage: status_page_test.sh MQLM_BINARY NODE_SRC_DIR NODE_DIR WORK_DIR [SCREENSHOT.png]
set -uo pipefail
mqlm=$1
node_src=$2
node_dir=$3
dir=$4
screenshot=${5:-}
source "$(dirname "${BASH_SOURCE[0]}")/http_server.sh"

chromium=${MQLM_CHROMIUM:-/usr/bin/chromium}
if [[ ! -x $chromium ]]; then
  echo "SKIP: no Chromium at $chromium (apt-get install chromium, or set MQLM_CHROMIUM)"
  exit 77
fi
[[ -d $node_dir/node_modules/playwright-core ]] ||
  { echo "no playwright-core in $node_dir: run the http.status_page_npm_ci test first"; exit 1; }
cp "$node_src"/*.test.mjs "$node_dir/"
mkdir -p "$dir"

# run_page_test ENV=VALUE...: the node tests with those variables, against the server started.
run_page_test() {
  env MQLM_CHROMIUM="$chromium" "$@" node --test --test-concurrency=1 "$node_dir"/status_page.test.mjs
}

rc=0
port=$(free_port)
start_server_at "$port" serve --port "$port" --status-sample-ms 250 || exit 1
run_page_test MQLM_HTTP_URL="$http_url" MQLM_SCREENSHOT="$screenshot" || rc=1
stop_server || rc=1

port=$(free_port)
start_server_at "$port" serve --port "$port" --status-sample-ms 250 --api-key "$api_key" || exit 1
run_page_test MQLM_KEYED_URL="$http_url" MQLM_API_KEY="$api_key" || rc=1
stop_server || rc=1
exit $rc
