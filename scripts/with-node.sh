#!/usr/bin/env bash
# Runs a command with another Node.js major first on PATH, the binary taken from the npm
# registry's node-linux-<arch> package (no other download source needed):
#   scripts/with-node.sh 24 npm test
# The binary is installed once per major under ${KVTIER_NODE_CACHE:-${TMPDIR:-/tmp}/kvtier-node}.
# Native addons here are N-API modules, so the ones built by the first Node load in this one.
set -euo pipefail
major="${1:?usage: with-node.sh MAJOR COMMAND...}"
shift
case "$(uname -m)" in
  x86_64) arch=x64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "with-node: no node-linux package for $(uname -m)" >&2; exit 1 ;;
esac
prefix="${KVTIER_NODE_CACHE:-${TMPDIR:-/tmp}/kvtier-node}/$major-$arch"
bin="$prefix/node_modules/node-linux-$arch/bin"
if [ ! -x "$bin/node" ]; then
  mkdir -p "$prefix"
  npm install --prefix "$prefix" --no-audit --no-fund --no-save --loglevel=error \
    "node-linux-$arch@$major" >&2
fi
export PATH="$bin:$PATH"
echo "with-node: $(command -v node) $(node --version)" >&2
exec "$@"
