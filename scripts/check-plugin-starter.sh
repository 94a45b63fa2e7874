#!/usr/bin/env bash
# A plug-in author's path, checked from a clean temporary directory outside the repository:
#   1. build and `npm pack` kvtier (in a copy of the working tree: the checkout's dist/ is untouched);
#   2. copy examples/plugin-starter out of the repository;
#   3. install kvtier from the tarball with a plain `npm install` (no flags): the starter's
#      devDependencies name it as file:kvtier.tgz, its peerDependencies as ^0.1.0;
#   4. typecheck with the starter's stock strict tsconfig (skipLibCheck off, so kvtier's
#      declarations are checked too) and check that kvtier's types come from its .d.ts files;
#   5. run the starter's tests: kvtier's contract suite (kvtier/testing) against its backend.
# Usage: bash scripts/check-plugin-starter.sh   (npm run check:plugin-starter; CI runs it)
#        KVTIER_KEEP_TMP=1 bash scripts/check-plugin-starter.sh   keeps the directory to look at
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-starter-check.XXXXXX")
finish() {
  if [ "${KVTIER_KEEP_TMP:-}" = 1 ]; then echo "check-plugin-starter: kept $work"; else rm -rf "$work"; fi
}
trap finish EXIT
fail() {
  echo "check-plugin-starter: FAILED: $*" >&2
  exit 1
}
case "$work" in "$root"/*) fail "the temporary directory $work is inside the repository" ;; esac

echo "== check-plugin-starter: pack kvtier (in $work/kvtier)"
mkdir "$work/kvtier"
git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1 || fail "$root is not a git work tree"
# Tracked and untracked files that git does not ignore, as they are in the working tree.
(cd "$root" && git ls-files -z --cached --others --exclude-standard) |
  while IFS= read -r -d '' f; do [ -f "$root/$f" ] && printf '%s\0' "$f"; done |
  (cd "$root" && tar -cf - --null -T -) | (cd "$work/kvtier" && tar -xf -)
# The build needs kvtier's dev dependencies (tsc); npm pack leaves node_modules out.
ln -s "$root/node_modules" "$work/kvtier/node_modules"
(cd "$work/kvtier" && npm run --silent build)
# The tarball carries kvtier's locked dependency tree as npm-shrinkwrap.json, so installing it
# resolves exactly the versions kvtier is tested with (a fresh resolution can name versions a
# registry mirror does not hold yet).
cp "$work/kvtier/package-lock.json" "$work/kvtier/npm-shrinkwrap.json"
# prepare would also rebuild the native addon, which is not part of the package.
(cd "$work/kvtier" && npm pack --ignore-scripts --silent --pack-destination "$work" >/dev/null)
tarball=$(ls "$work"/kvtier-*.tgz)
tar -tzf "$tarball" >"$work/contents.txt"
for f in package/npm-shrinkwrap.json package/dist/src/index.d.ts package/dist/src/index.js \
  package/dist/test/contract/backend.contract.d.ts package/dist/test/contract/backend.contract.js \
  package/dist/test/contract/store.contract.d.ts package/dist/test/contract/store.contract.js; do
  grep -qx "$f" "$work/contents.txt" || fail "$(basename "$tarball") lacks $f"
done
echo "   $(basename "$tarball"): $(wc -l <"$work/contents.txt") files"

echo "== check-plugin-starter: copy the starter to $work/my-plugin"
tar -C "$root/examples" --exclude=node_modules --exclude=dist --exclude=kvtier.tgz \
  --exclude=package-lock.json -cf - plugin-starter | tar -C "$work" -xf -
mv "$work/plugin-starter" "$work/my-plugin"
cp "$tarball" "$work/my-plugin/kvtier.tgz"
cd "$work/my-plugin"

echo "== check-plugin-starter: npm install"
npm install
node -e '
  const p = require("./package.json");
  if (p.peerDependencies?.kvtier !== "^0.1.0") throw new Error("peerDependencies.kvtier changed: " + p.peerDependencies?.kvtier);
  const k = require("./node_modules/kvtier/package.json");
  for (const t of [k.types, k.exports["."].types, k.exports["./testing"].types])
    if (!t.endsWith(".d.ts")) throw new Error("kvtier types are not declarations: " + t);
'

echo "== check-plugin-starter: npm run typecheck (strict, skipLibCheck false)"
npm run --silent typecheck
from_src=$(npx tsc -p tsconfig.json --noEmit --listFiles | grep '/node_modules/kvtier/' | grep -v '\.d\.ts$' || true)
[ -z "$from_src" ] || fail "tsc read kvtier sources instead of declarations: $from_src"

echo "== check-plugin-starter: npm test (the contract suite from kvtier/testing)"
npm test
echo "check-plugin-starter: passed"
