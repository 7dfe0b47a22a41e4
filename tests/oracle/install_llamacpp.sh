#!/usr/bin/env bash
# Installs llama.cpp, the oracle of the format and model tests, into DEST from the npm registry:
# DEST/lib its CPU libraries (libllama, libggml-base, one libggml-cpu-* per processor family, as
# @node-llama-cpp/linux-x64 ships them) and DEST/include their headers (llama.h, ggml*.h, from the
# source node-llama-cpp carries at the same commit), DEST/src/llama-quant.cpp for reading, and
# DEST/templates the chat templates llama.cpp collects from real models (models/templates/*.jinja:
# the chat template conformance test renders each).
# A program loads a model only after ggml_backend_load_all_from_path("DEST/lib").
# Idempotent: a second run of the same script does nothing.
#
# Usage: install_llamacpp.sh DEST
set -euo pipefail
VERSION=3.22.1  # node-llama-cpp; llama.cpp de3ff81 of 2026-09-28
dest=${1:?usage: install_llamacpp.sh DEST}
stamp="$dest/.installed"
[[ -f $stamp && $stamp -nt $0 && $(cat "$stamp") == "$VERSION" ]] && { echo "install_llamacpp: $dest has llama.cpp of node-llama-cpp $VERSION"; exit 0; }
for tool in npm git tar; do
  command -v "$tool" >/dev/null || { echo "install_llamacpp: $tool is needed (tools/install-deps.sh)" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack --silent "node-llama-cpp@$VERSION" "@node-llama-cpp/linux-x64@$VERSION" >/dev/null
mkdir source binaries
tar xzf "node-llama-cpp-$VERSION.tgz" -C source
tar xzf "node-llama-cpp-linux-x64-$VERSION.tgz" -C binaries
git -c advice.detachedHead=false clone -q source/package/llama/gitRelease.bundle src
rm -rf "$dest"
mkdir -p "$dest/lib" "$dest/include" "$dest/src" "$dest/templates"
cp binaries/package/bins/linux-x64/*.so "$dest/lib/"
(cd "$dest/lib" && for f in lib*.v*.so; do ln -sfn "$f" "${f%%.v*}.so"; done)
cp src/include/*.h src/ggml/include/*.h "$dest/include/"
cp src/src/llama-quant.cpp "$dest/src/"
cp src/models/templates/*.jinja "$dest/templates/"
echo "$VERSION" > "$stamp"
echo "install_llamacpp: llama.cpp of node-llama-cpp $VERSION in $dest"
