#!/usr/bin/env bash
# One device call for what was written without a GPU (2026-12-07, third session), sized for
# the 600 s limit: the package built with the machine's own environment, the CUDA tests (they
# include the cta combine's and the PDL launch's: test_num_splits_same_result,
# test_combine_many_splits), memcheck over the decode cases, then the decode combine's forms
# timed: in CUDA graphs (the kernels' chain: decode_env_ab.py --graph), in eager calls, per
# kernel (kernel_times.py), against the split count (decode_splits.py) and in the benchmark's
# timing beside SDPA (decode_cells.py). Usage: bash tools/device/pending_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
BWD=0 SANITIZE=1 SANITIZE_ARGS="--decode" SANITIZE_LIMIT=${SANITIZE_LIMIT:-90} \
  TEST_LIMIT=${TEST_LIMIT:-120} TEST_HANG_S=60 bash tools/device/build_test_call.sh
export PYTHONPATH=$PWD
CELLS="1x4096 1x16384 1x65536 8x4096 8x16384 1x16384p256"
for env in "FLASHATTN_DECODE_COMBINE=cta" "FLASHATTN_DECODE_PDL=1" \
           "FLASHATTN_DECODE_COMBINE=cta FLASHATTN_DECODE_PDL=1"; do
  echo "== graph A/B: $env"
  timeout 60 python3 tools/device/decode_env_ab.py --graph --env $env --cells $CELLS \
    --rounds 7 --calls 20 2>&1 | grep -v Warn
done
echo "== eager A/B"
timeout 60 python3 tools/device/decode_env_ab.py --env FLASHATTN_DECODE_COMBINE=cta \
  FLASHATTN_DECODE_PDL=1 --cells $CELLS --rounds 7 --calls 20 2>&1 | grep -v Warn
for form in "FLASHATTN_DECODE_COMBINE=par" "FLASHATTN_DECODE_COMBINE=cta"; do
  echo "== decode kernel times, $form"
  env $form timeout 30 python3 tools/device/kernel_times.py --cells dec:1:4096 dec:1:16384 \
    dec:8:4096 2>&1 | grep -E "us/call|combine|decode_kernel"
done
echo "== split counts, cta + PDL"
FLASHATTN_DECODE_COMBINE=cta FLASHATTN_DECODE_PDL=1 timeout 60 python3 \
  tools/device/decode_splits.py --cells 1x4096 1x16384 8x4096 --splits 0 8 16 24 33 48 66 2>&1 |
  grep -v Warn
for form in "FLASHATTN_DECODE_COMBINE=par" "FLASHATTN_DECODE_COMBINE=cta FLASHATTN_DECODE_PDL=1"; do
  echo "== decode cells, $form"
  env $form timeout 50 python3 tools/device/decode_cells.py --cells 1x4096 1x16384 1x65536 \
    8x4096 2>&1 | tail -5
done
