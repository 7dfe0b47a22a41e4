#!/usr/bin/env bash
# Installs the node test suite's packages into DEST_DIR with `npm ci` from the package.json and
# package-lock.json in SRC_DIR (committed), unless DEST_DIR already holds exactly that install:
# the network is needed once per lock, not per test run. The source tree is never written.
# Usage: npm_ci.sh SRC_DIR DEST_DIR
set -euo pipefail
src=$1
dest=$2
command -v node >/dev/null && command -v npm >/dev/null ||
  { echo "npm_ci: node and npm are needed (tools/install-deps.sh installs them)" >&2; exit 1; }
mkdir -p "$dest"
stamp="$dest/node_modules/.mqlm-installed"
want=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -d' ' -f1)
if [[ -f $stamp && $(cat "$stamp") == "$want" ]]; then
  echo "npm_ci: $dest is up to date with the lock"
  exit 0
fi
cp "$src/package.json" "$src/package-lock.json" "$dest/"
(cd "$dest" && npm ci --no-audit --no-fund)
echo "$want" >"$stamp"
echo "npm_ci: installed into $dest"
