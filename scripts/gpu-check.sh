#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md), run from the repository root with .gpu/ carried
# (scripts/gpu-bundle.sh). Needs python3 with PyTorch (CUDA) there; with --cpu, python3 with
# numpy here (the host device: every step but the CUDA calls). Nothing else is installed.
#   bash scripts/gpu-check.sh [--cpu] [--out DIR] [--bundle DIR] [-- gpu_check.py options]
# Writes to DIR (default $OUT, else ./gpu-report): gpu-report.json (the check), selftest.json
# and selftest.txt (the addon's copy paths without Node), sidecar and driver logs,
# nvidia-smi.txt. Exits non-zero when a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=cuda
out=${OUT:-gpu-report}
bundle=.gpu
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) mode=cpu; shift ;;
    --out) out=$2; shift 2 ;;
    --bundle) bundle=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: scripts/gpu-check.sh [--cpu] [--out DIR] [--bundle DIR] [-- options]" >&2; exit 2 ;;
  esac
done
for f in node.xz kvtier.tar.xz manifest.json; do
  if [ ! -f "$bundle/$f" ]; then
    echo "gpu-check: $bundle/$f is missing: run scripts/gpu-bundle.sh here and carry $bundle" >&2
    exit 2
  fi
done
# The Python with numpy (--cpu: Debian's, as the connector's tests use) or with torch.
python=python3
if [ "$mode" = cpu ] && /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1; then python=/usr/bin/python3; fi
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-gpu-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
started=$(date +%s)

# Unpack with Python's lzma and tarfile: the GPU image may lack xz.
"$python" - "$bundle" "$work" <<'PY' || exit 2
import lzma, os, shutil, sys, tarfile
bundle, work = sys.argv[1], sys.argv[2]
with lzma.open(os.path.join(bundle, "node.xz")) as src, open(os.path.join(work, "node"), "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
os.chmod(os.path.join(work, "node"), 0o755)
with tarfile.open(os.path.join(bundle, "kvtier.tar.xz")) as t:
    t.extractall(work)
PY
echo "gpu-check: bundle $(tr -d '\n ' <"$bundle/manifest.json" | cut -c1-200)"
echo "gpu-check: node $("$work/node" --version), python $("$python" -c 'import sys; print(sys.version.split()[0])'), unpacked in $(( $(date +%s) - started )) s"

status=0
if [ "$mode" = cuda ]; then
  nvidia-smi -L >"$out/nvidia-smi.txt" 2>&1 || true
  cat "$out/nvidia-smi.txt"
  if [ -x "$work/kvtier/copy_selftest" ]; then
    echo "== copy self-test (native-cuda/test/copy_selftest.cu, no Node)"
    timeout 150 "$work/kvtier/copy_selftest" --json "$out/selftest.json" 2>&1 | tee "$out/selftest.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || { echo "gpu-check: the copy self-test failed ($rc)"; status=1; }
  else
    echo "gpu-check: the bundle has no copy self-test (built without nvcc)"; status=1
  fi
fi

# The sidecar as the CUDA image runs it (Dockerfile.cuda, the compose file's gpu profile): no
# config, the image's and the kvtier-gpu service's environment (test/integration/compose-config.test.ts
# keeps these equal to theirs), its volume a directory here. It must serve (CUDA copies on, with
# --cpu the host device), answer PING, stop on SIGTERM with exit 0, and leave its chunk
# directory and epoch on the volume, nothing in HOME.
echo "== the sidecar as the CUDA image runs it"
image_run() {
  local vol="$work/image/cache" home="$work/image/home" log="$out/image-sidecar.log"
  mkdir -p "$vol/kvtier" "$home"
  : >"$log"
  env -i PATH="$PATH" HOME="$home" \
    XDG_CACHE_HOME="$vol" CUDA_CACHE_PATH="$vol/kvtier/cuda" NVIDIA_VISIBLE_DEVICES="${NVIDIA_VISIBLE_DEVICES:-all}" NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    KVTIER_LOG_LEVEL=info KVTIER_LISTEN='tcp://127.0.0.1:*' KVTIER_METRICS_HOST=127.0.0.1 KVTIER_METRICS_PORT=0 \
    ${CUDA_VISIBLE_DEVICES:+CUDA_VISIBLE_DEVICES="$CUDA_VISIBLE_DEVICES"} \
    "$work/node" "$work/kvtier/dist/kvtier.mjs" serve >"$log" 2>&1 &
  local pid=$! endpoint="" i
  for i in $(seq 1 600); do
    endpoint=$(sed -n 's/.*"msg":"serving on \(tcp:[^,"]*\).*/\1/p' "$log" | head -1)
    [ -n "$endpoint" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$endpoint" ]; then
    echo "gpu-check: the sidecar did not start as the image runs it:"; tail -5 "$log"
    kill -9 "$pid" 2>/dev/null; return 1
  fi
  env -i PATH="$PATH" HOME="$home" "$work/node" "$work/kvtier/dist/kvtier.mjs" ping --json \
    --endpoint "$endpoint" >"$out/image-ping.json" 2>>"$log"
  local ping=$?
  kill -TERM "$pid"; wait "$pid"; local rc=$?
  "$python" - "$out/image-ping.json" "$vol" "$home" "$mode" "$ping" "$rc" "$out/image-run.json" <<'PY'
import json, os, sys
ping_file, vol, home, mode, ping_rc, exit_rc, report = sys.argv[1:]
failures = []
try:
    ping = json.load(open(ping_file))
except Exception as e:
    ping = {}
    failures.append(f"PING gave no JSON (exit {ping_rc}): {e}")
cuda = (ping.get("copyEngine") or {}).get("cuda") or {}
if mode == "cuda" and cuda.get("available") is not True:
    failures.append(f"PONG says CUDA copies are not available: {cuda}")
if exit_rc != "0":
    failures.append(f"SIGTERM: exit {exit_rc}, not 0")
tiers = {t.get("name"): t for t in ping.get("tiers", [])}
disk = (tiers.get("disk") or {}).get("path")
if disk != os.path.join(vol, "kvtier", "chunks"):
    failures.append(f"the disk tier is at {disk}, not on the volume")
if not os.path.isdir(os.path.join(vol, "kvtier", "epochs")):
    failures.append("no epoch on the volume")
if os.listdir(home):
    failures.append(f"HOME holds {os.listdir(home)}")
json.dump({"ok": not failures, "failures": failures, "config": ping.get("config"),
           "tiers": list(tiers.values()), "cuda": cuda}, open(report, "w"), indent=2)
print("gpu-check: image run", "ok" if not failures else f"FAILED: {failures}")
sys.exit(0 if not failures else 1)
PY
}
image_run || status=1

echo "== kvtier check ($mode)"
cpu_flag=()
[ "$mode" = cpu ] && cpu_flag=(--cpu)
PYTHONUNBUFFERED=1 timeout 420 "$python" python/gpu/gpu_check.py --node "$work/node" --kvtier "$work/kvtier" \
  --out "$out" --manifest "$bundle/manifest.json" "${cpu_flag[@]}" "${extra[@]}"
rc=$?
[ "$rc" = 0 ] || status=$rc
echo "gpu-check: done in $(( $(date +%s) - started )) s, exit $status; report in $out/gpu-report.json"
exit "$status"
