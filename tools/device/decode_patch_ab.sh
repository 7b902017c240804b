#!/usr/bin/env bash
# One GPU call: the decode block patch (benchmarks/notes/decode_block_sass_20261207.patch, a
# helper's, compiled only) and / or the split kernel's L2 prefetch hint (the build switch
# FLASHATTN_DECODE_L2_PF, 0 by default) against the package as it is: the package built in
# place and each variant beside it (tools/device/ab_builds.sh's variants: the patched tree with
# every head dim; the prefetch build at d 128 alone), the kvcache tests on each, the decode grid
# base / variants / base, then the kernels' chain in CUDA graphs per build beside cuDNN
# (decode_splits.py --graph) and memcheck --decode on the patched build.
# PATCH: another patch file, or "none" (no patched tree); PF: 128 or 256 adds the prefetch
# variant (default none). Usage: bash tools/device/decode_patch_ab.sh (~8 min);
# PATCH=none PF=256 bash tools/device/decode_patch_ab.sh (the hint alone, ~5 min).
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$PWD
PATCH=${PATCH:-benchmarks/notes/decode_block_sass_20261207.patch}
variants=""
trees=()
if [ "$PATCH" != none ]; then
  rm -rf /tmp/lean && mkdir -p /tmp/lean
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C /tmp/lean
  (cd /tmp/lean && git apply "$ROOT/$PATCH") || { echo "== the patch does not apply"; exit 1; }
  variants="lean:::/tmp/lean"; trees+=(/tmp/ab/lean)
fi
if [ -n "${PF:-}" ]; then
  variants="$variants pf$PF:-DFLASHATTN_DECODE_L2_PF=$PF:128"; trees+=(/tmp/ab/pf$PF)
fi
[ -n "$variants" ] || { echo "== nothing to compare (PATCH=none and no PF)"; exit 1; }
VARIANTS="$variants" AB_JOBS=${AB_JOBS:-8} TEST_LIMIT=${TEST_LIMIT:-120} \
  TEST_ARGS="tests/test_kvcache.py tests/test_kvcache_edges.py -k cuda" \
  BENCH_ARGS="--modes --decode --impls flashattn sdpa_cudnn" bash tools/device/ab_builds.sh
for tree in "$ROOT" "${trees[@]}" "$ROOT"; do
  echo "== the kernels' chain in CUDA graphs, $tree"
  PYTHONPATH=$tree timeout 60 python3 tools/device/decode_splits.py --graph --splits 0 \
    --cells 1x4096 1x16384 1x65536 8x4096 8x16384 32x16384 2>&1 | grep -v Warn
done
if [ "$PATCH" != none ]; then
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/ab/lean timeout 100 compute-sanitizer \
    --tool memcheck --error-exitcode 17 python3 tools/sanitize_cases.py --decode > /tmp/m_lean.log 2>&1
  echo "== memcheck --decode, patched: rc=$? $(grep 'ERROR SUMMARY' /tmp/m_lean.log | tail -n 1)"
fi
