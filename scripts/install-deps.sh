#!/usr/bin/env bash
# Install the Debian 12 packages tokpipe needs, only those missing.
# Safe to run again: it does nothing when everything is present.
set -euo pipefail

PKGS=(
  build-essential pkg-config clang libclang-rt-14-dev
  libzmq3-dev libmsgpack-dev libopenblas-dev libyaml-dev libsystemd-dev
  libcjson-dev libcmocka-dev libpcre2-dev libutf8proc-dev libedit-dev
  python3 python3-zmq python3-msgpack python3-sentencepiece python3-numpy python3-jinja2
  json-schema-test-suite python3-jsonschema
  systemd
  # tests/netns_cluster_test.py makes network namespaces (ip netns)
  iproute2
  # tokpipe chat's tests drive it in a real terminal
  tmux
  libmicrohttpd-dev curl prometheus nodejs
  # make bench builds llama.cpp's llama-bench from source (its baseline);
  # build-essential brings the C++ compiler
  git cmake
)
# Debian's nodejs needs its npm package; NodeSource's nodejs ships npm itself
# (and conflicts with Debian's npm)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

# The official API clients the HTTP tests drive (openai, @anthropic-ai/sdk),
# into $BUILD/npm where those tests look. Best effort: without the npm
# registry a test tries again itself, and skips saying why.
npm_clients() {
  local dir="${TP_BUILD_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build}/npm" need=()
  command -v npm >/dev/null 2>&1 || return 0
  [ -f "$dir/node_modules/openai/package.json" ] || need+=(openai@4)
  [ -f "$dir/node_modules/@anthropic-ai/sdk/package.json" ] || need+=(@anthropic-ai/sdk@1)
  [ ${#need[@]} -eq 0 ] && return 0
  echo "install-deps: npm install ${need[*]} into $dir" >&2
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --silent "${need[@]}" >&2 ||
    echo "install-deps: npm install failed (no registry?); the tests that need it skip" >&2
}
trap npm_clients EXIT

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
