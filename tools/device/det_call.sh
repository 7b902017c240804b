#!/usr/bin/env bash
# One call (2026-12-07, fifth session): build + tests -k cuda + memcheck --sm90
# (build_test_call.sh), then the deterministic backward's switches A/B (det_order_ab.py) and
# the sparse backward's pair-major order A/B (sparse_order_ab.py), each under a time limit.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
BWD=0 SANITIZE=1 SANITIZE_ARGS="--sm90" SANITIZE_LIMIT=${SANITIZE_LIMIT:-120} \
  TEST_LIMIT=${TEST_LIMIT:-200} TEST_HANG_S=60 bash tools/device/build_test_call.sh
PYTHONPATH=$PWD timeout ${DET_LIMIT:-120} python3 tools/device/det_order_ab.py \
  ${DET_ARGS:---d 64 128 256 --N 1024 4096 16384 --rounds 5 --calls 4 --modes dq2} 2>&1 | tee "$OUT/det_order_ab.txt"
echo "== det A/B rc=${PIPESTATUS[0]}"
PYTHONPATH=$PWD timeout ${SPARSE_LIMIT:-90} python3 tools/device/sparse_order_ab.py \
  --flag FLASHATTN_SM90_SPARSE_PAIRS --N 2048 8192 --d 64 128 \
  --masks random25 random50 local_global 2>&1 | tee "$OUT/sparse_pairs_ab.txt"
echo "== sparse pairs A/B rc=${PIPESTATUS[0]}"
