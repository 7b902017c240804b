#!/usr/bin/env bash
# The release wheel on the H200, unchanged (issue 18): built elsewhere by tools/build_wheel.sh
# and carried as dist/flashattn-*.whl (run's carry: ["dist"]), installed with pip --no-deps into
# a scratch site beside the machine's own torch (no network there), then the CUDA tests, run
# from outside the source tree with a probe that flashattn is the wheel's and that the sm90
# kernels loaded. Env: K (pytest -k, default "cuda"), LIMIT (seconds, default 300).
set -uo pipefail
REPO=$PWD
WHEEL=$(ls dist/flashattn-*manylinux*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || WHEEL=$(ls dist/flashattn-*.whl 2>/dev/null | head -n 1)
[ -n "$WHEEL" ] || { echo "wheel_h200: no dist/flashattn-*.whl carried"; exit 2; }
SITE=/tmp/wheel_site RUN=/tmp/wheel_run
rm -rf "$SITE" "$RUN" && mkdir -p "$SITE" "$RUN"
python3 -m pip install -q --no-deps --no-index --target "$SITE" "$WHEEL" || exit 1
echo "wheel_h200: $(basename "$WHEEL") ($(du -m "$WHEEL" | cut -f1) MiB)"
cd "$RUN" && PYTHONPATH="$SITE" python3 - <<'PY' || exit 1
import torch, flashattn
assert flashattn.__file__.startswith("/tmp/wheel_site"), f"imported {flashattn.__file__}"
q = torch.randn(1, 256, 4, 128, device="cuda", dtype=torch.bfloat16)
print("torch", torch.__version__, "| flashattn", flashattn.__file__, "|",
      flashattn.BUILD_CONFIG.get("cuda_archs"), "| path", flashattn.kernel_path(q, q, q))
PY
cd "$RUN" && PYTHONPATH="$SITE" FLASHATTN_REQUIRE_CUDA=1 timeout -s INT -k 20 "${LIMIT:-300}" \
  python3 -m pytest -q -rfEs -p no:cacheprovider -n 8 "$REPO/tests" -k "${K:-cuda}" \
  > "${OUT:-/tmp}/wheel_tests.log" 2>&1
echo "wheel_h200: tests rc=$?: $(tail -n 1 "${OUT:-/tmp}/wheel_tests.log")"
grep -E "^(FAILED|ERROR)" "${OUT:-/tmp}/wheel_tests.log" | head -n 20
