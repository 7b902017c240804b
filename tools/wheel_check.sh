#!/usr/bin/env bash
# tools/wheel_check.sh WHEEL: the built wheel, installed as it is (pip install --no-deps, no
# rebuild) into fresh venvs, one per torch: the oldest torch it supports (the newest patch of
# the version its metadata requires, torch>=2.10 -> the newest 2.10.x on the index) and the
# newest torch the index offers. In each, `import flashattn`, then the CPU tests with
# CUDA_VISIBLE_DEVICES= (no GPU); one summary line per torch at the end, which says where the
# CUDA runtime the extension links (libcudart.so.13 for a CUDA 13 build) came from: torch's own
# (the venv's), or elsewhere on the machine (a CUDA toolkit in ld.so.cache: PyPI's torch 2.10.0
# is a CUDA 12.8 build), which a user's machine need not have.
# Environment:
#   TORCH_VERSIONS  pip specs instead of the two picked ("2.11.0 2.13.0+cpu"; a +cpu one needs
#                   an index that has it, e.g. TORCH_PIP_ARGS="--index-url .../whl/cpu")
#   TORCH_PIP_ARGS  extra pip arguments for the torch install and version lookup
#   PYTEST_ARGS     default: -k "not cuda"
#   WORK            venvs and logs (default /tmp/wheel_check); PYTHON (default python3)
set -uo pipefail
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: $0 WHEEL" >&2; exit 2; }
WHEEL=$(realpath "$1")
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK="${WORK:-/tmp/wheel_check}"
PYTHON="${PYTHON:-python3}"
read -r -a PIP_EXTRA <<< "${TORCH_PIP_ARGS:-}"
# The versions under test are exact pins: a machine-wide pip constraint file must not veto them.
export PIP_CONSTRAINT=/dev/null
pytest_args=(-k "not cuda")
if [ -n "${PYTEST_ARGS:-}" ]; then eval "pytest_args=($PYTEST_ARGS)"; fi
mkdir -p "$WORK/run"  # the tests run from here: no flashattn source tree on sys.path

requirement=$("$PYTHON" - "$WHEEL" <<'EOF'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
for line in z.read(meta).decode().splitlines():
    m = re.match(r"Requires-Dist: torch\s*\(?>=\s*([\d.]+)", line)
    if m:
        print(m.group(1))
EOF
)
if [ -z "${TORCH_VERSIONS:-}" ]; then
  available=$("$PYTHON" -m pip index versions torch "${PIP_EXTRA[@]}" 2>/dev/null |
              sed -n 's/^Available versions: //p' | tr -d ',')
  [ -n "$available" ] || { echo "wheel_check: pip index versions torch: nothing" >&2; exit 1; }
  newest=$(echo "$available" | tr ' ' '\n' | grep -E '^[0-9]+\.[0-9]+\.[0-9]+$' | head -n 1)
  oldest=$(echo "$available" | tr ' ' '\n' | grep -E "^${requirement//./\\.}\.[0-9]+$" | head -n 1)
  [ -n "$oldest" ] || { echo "wheel_check: no torch $requirement.x on the index" >&2; exit 1; }
  TORCH_VERSIONS="$oldest $newest"
fi
echo "wheel_check: $(basename "$WHEEL") (requires torch>=$requirement); torch: $TORCH_VERSIONS"

summary=()
for spec in $TORCH_VERSIONS; do
  venv="$WORK/torch-$spec"; log="$WORK/torch-$spec.log"
  rm -rf "$venv"
  t0=$(date +%s)
  if ! { "$PYTHON" -m venv "$venv" &&
         "$venv/bin/python" -m pip install -q "torch==$spec" numpy pytest "${PIP_EXTRA[@]}" &&
         "$venv/bin/python" -m pip install -q --no-deps "$WHEEL"; } > "$log" 2>&1; then
    tail -n 20 "$log"; summary+=("torch $spec: install failed (see $log)"); continue
  fi
  echo "== torch $spec: installed in $(( $(date +%s) - t0 )) s"
  # What loaded: the torch, its CUDA, and where the CUDA runtime the extension needs came from.
  probe=$(cd "$WORK/run" && CUDA_VISIBLE_DEVICES= "$venv/bin/python" -c '
import sys, torch
head = f"torch {torch.__version__} (CUDA {torch.version.cuda}, python {sys.version.split()[0]})"
try:
    import flashattn
except ImportError as e:
    print(f"{head}: import failed: {e}"); sys.exit(1)
assert flashattn.__file__.startswith(sys.prefix), f"imported {flashattn.__file__}, not the wheel"
cudart = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcudart.so" in l})
outside = [p for p in cudart if not p.startswith(sys.prefix)]
where = ("outside the venv: " + ", ".join(outside)) if outside else "the venv\x27s" if cudart else "none"
print(f"{head}: import ok, CUDA runtime {where}")' 2>&1)
  rc=$?
  echo "$probe"
  if [ $rc -ne 0 ]; then summary+=("$(echo "$probe" | tail -n 1)"); continue; fi
  t0=$(date +%s)
  (cd "$WORK/run" && CUDA_VISIBLE_DEVICES= "$venv/bin/python" -m pytest -q -p no:cacheprovider \
     "$REPO/tests" "${pytest_args[@]}") >> "$log" 2>&1
  rc=$?
  grep -E "^(FAILED|ERROR)" "$log" | head -n 20
  summary+=("$(echo "$probe" | tail -n 1); tests rc=$rc, $(tail -n 1 "$log") ($(( $(date +%s) - t0 )) s)")
done

echo "== wheel_check summary ($(basename "$WHEEL"))"
status=0
for line in "${summary[@]}"; do
  echo "wheel_check: $line"
  [[ "$line" == *"; tests rc=0,"* ]] || status=1
done
exit $status
