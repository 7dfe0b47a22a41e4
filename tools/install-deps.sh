#!/usr/bin/env bash
# Installs everything mqlm needs to build and test on Debian 12, as root. Idempotent: a second
# run installs nothing and exits 0.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config clang clang-tidy libclang-rt-14-dev
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libspdlog-dev libfmt-dev
  libcli11-dev nlohmann-json3-dev libpcre2-dev libxxhash-dev
  libvulkan-dev glslc mesa-vulkan-drivers vulkan-tools
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-zmq python3-msgpack
  python3-jinja2  # the chat template conformance test renders every template with jinja2 too
  libboost-dev  # Boost.Beast and Asio (header-only): the HTTP server
  libcpp-httplib-dev jq curl python3-prometheus-client  # cpp-httplib: the http actor tests' client
  file  # cpack -G DEB finds the binaries to list their libraries' packages with it (tools.install)
  chromium  # the status page's test loads it headless (http.status_page)
)
# The http tests drive the server with the `openai` npm package (installed by the tests with
# `npm ci`), so they need Node.js and npm. A machine that has them (Node 20 on ours) keeps its
# own; one without gets Debian's (Node 18, on which the tests have not been run).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install-deps: missing ${missing[*]}; run this script as root (or with sudo)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
