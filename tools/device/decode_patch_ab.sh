#!/usr/bin/env bash
# One GPU call: the decode block patch (benchmarks/notes/decode_block_sass_20261207.patch, a
# helper's, compiled only) against the package as it is: the package built in place and the
# patched tree (every head dim) beside it (tools/device/ab_builds.sh's tree variant), the
# kvcache tests on both, the decode grid base / patched / base, then the kernels' chain in CUDA
# graphs per build beside cuDNN (decode_splits.py --graph) and memcheck --decode on the patched
# build. PATCH: another patch file. Usage: bash tools/device/decode_patch_ab.sh (~8 min).
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$PWD
PATCH=${PATCH:-benchmarks/notes/decode_block_sass_20261207.patch}
rm -rf /tmp/lean && mkdir -p /tmp/lean
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C /tmp/lean
(cd /tmp/lean && git apply "$ROOT/$PATCH") || { echo "== the patch does not apply"; exit 1; }
VARIANTS="lean:::/tmp/lean" AB_JOBS=${AB_JOBS:-8} TEST_LIMIT=${TEST_LIMIT:-120} \
  TEST_ARGS="tests/test_kvcache.py tests/test_kvcache_edges.py -k cuda" \
  BENCH_ARGS="--modes --decode --impls flashattn sdpa_cudnn" bash tools/device/ab_builds.sh
for tree in "$ROOT" /tmp/ab/lean "$ROOT"; do
  echo "== the kernels' chain in CUDA graphs, $tree"
  PYTHONPATH=$tree timeout 60 python3 tools/device/decode_splits.py --graph --splits 0 \
    --cells 1x4096 1x16384 1x65536 8x4096 8x16384 2>&1 | grep -v Warn
done
PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=/tmp/ab/lean timeout 100 compute-sanitizer \
  --tool memcheck --error-exitcode 17 python3 tools/sanitize_cases.py --decode > /tmp/m_lean.log 2>&1
echo "== memcheck --decode, patched: rc=$? $(grep 'ERROR SUMMARY' /tmp/m_lean.log | tail -n 1)"
