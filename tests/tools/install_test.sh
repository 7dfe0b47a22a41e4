#!/usr/bin/env bash
# `cmake --install` into an empty prefix gives a binary that serves the demo model from anywhere:
# run from another folder, it finds the model under share/mqlm beside its bin/, generates and
# serves it over HTTP; a copy of the binary alone still serves a model it is given, and without
# one says where it looked. `cpack -G DEB` packages the same files under /usr.
# Usage: install_test.sh CMAKE CPACK BUILD_DIR WORK_DIR
set -uo pipefail
cmake=$1
cpack=$2
build=$3
dir=$4
source "$(dirname "${BASH_SOURCE[0]}")/../actors/http/http_server.sh"
source "$(dirname "${BASH_SOURCE[0]}")/../checks.sh"

rm -rf "$dir"
mkdir -p "$dir/elsewhere" "$dir/bare/bin"
prefix=$dir/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$dir/install.log" 2>&1 || { fail "cmake --install" "$dir/install.log"; exit 1; }
for file in bin/mqlm share/mqlm/demo.gguf share/doc/mqlm/examples/mqlm.service; do
  [[ -f $prefix/$file ]] || fail "the install has no $file" "$dir/install.log"
done
mqlm=$prefix/bin/mqlm
cd "$dir/elsewhere" || exit 1

"$mqlm" generate -p "Never trust a man who" -n 8 --temperature 0 >"$dir/generate.out" 2>&1 ||
  fail "the installed mqlm generate failed" "$dir/generate.out"
grep -qF "model: $prefix/share/mqlm/demo.gguf" "$dir/generate.out" ||
  fail "generate did not load the installed demo model" "$dir/generate.out"

port=$(free_port)
if start_server_at "$port" --log-level info serve --port "$port"; then
  grep -qF "serving $prefix/share/mqlm/demo.gguf on http://127.0.0.1:$port" "$dir/serve.log" ||
    fail "serve did not serve the installed demo model" "$dir/serve.log"
  code=$(curl -s -o "$dir/completion.json" -w '%{http_code}' "$http_url/v1/completions" \
    -H "Content-Type: application/json" -d '{"model": "demo", "prompt": "Never trust a man who", "max_tokens": 8, "temperature": 0}')
  [[ $code == 200 ]] || fail "a completion from the installed server: HTTP $code" "$dir/completion.json" "$dir/serve.log"
  [[ $(jq '.usage.completion_tokens' "$dir/completion.json") == 8 ]] ||
    fail "the completion has not 8 tokens" "$dir/completion.json"
  stop_server || fail "the installed server did not stop cleanly"
else
  fail "the installed mqlm serve did not start"
fi

# The binary alone, without share/: a model named is enough, and none named is a clear error.
cp "$mqlm" "$dir/bare/bin/mqlm"
"$dir/bare/bin/mqlm" generate -p "Hello" -n 2 >"$dir/bare.out" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "the bare binary with no model: exit $rc, wanted 2" "$dir/bare.out"
grep -qF "the demo model is not at $dir/bare/share/mqlm/demo.gguf" "$dir/bare.out" ||
  fail "the bare binary does not say where it looked" "$dir/bare.out"
port=$(free_port)
if start_server_at "$port" serve --model "demo=$prefix/share/mqlm/demo.gguf" --port "$port"; then
  stop_server || fail "the bare binary's server did not stop cleanly"
else
  fail "the bare binary did not serve a model named with --model ID=PATH"
fi

# The Debian package: the same files under /usr, and the libraries' packages as its dependencies.
"$cpack" -G DEB --config "$build/CPackConfig.cmake" -B "$dir/deb" >"$dir/cpack.log" 2>&1 || fail "cpack -G DEB" "$dir/cpack.log"
deb=$(ls "$dir"/deb/mqlm_*.deb 2>/dev/null | head -n 1)
if [[ -n $deb ]]; then
  dpkg-deb -c "$deb" >"$dir/deb.contents"
  for file in usr/bin/mqlm usr/share/mqlm/demo.gguf usr/share/doc/mqlm/examples/mqlm.service; do
    grep -q " \./$file\$" "$dir/deb.contents" || fail "the .deb has no /$file" "$dir/deb.contents"
  done
  dpkg-deb -f "$deb" Depends | grep -q libzmq || fail "the .deb does not depend on libzmq" "$dir/cpack.log"
else
  fail "cpack made no .deb" "$dir/cpack.log"
fi

end_checks "all install checks passed"
