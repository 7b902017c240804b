#!/usr/bin/env bash
# One device call for what was written without a GPU (2026-12-07, third session, after its
# calls 1-2), sized for the 600 s limit: the package built with the machine's own environment,
# the CUDA tests (the decode combine's new defaults; test_sm90_small_tile*, the 64-row forward
# tiles under FLASHATTN_SM90_FWD_SMALL), memcheck over the sm90 and decode cases, then the
# 64-row tiles timed against the default and SDPA cuDNN (fwd_env_ab.py) and the decode
# defaults against the serial combine in a plain launch (decode_env_ab.py --graph).
# Usage: bash tools/device/pending_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
BWD=0 SANITIZE=1 SANITIZE_ARGS="--sm90,--decode" SANITIZE_LIMIT=${SANITIZE_LIMIT:-100} \
  TEST_LIMIT=${TEST_LIMIT:-120} TEST_HANG_S=60 bash tools/device/build_test_call.sh
export PYTHONPATH=$PWD
echo "== 64-row forward tiles against the default and cuDNN"
timeout 150 python3 tools/device/fwd_env_ab.py 2>&1 | grep -v Warn
echo "== decode defaults against the serial combine in a plain launch (CUDA graphs)"
timeout 60 python3 tools/device/decode_env_ab.py --graph --cells 1x4096 1x16384 8x4096 \
  1x16384p256 --rounds 7 --calls 20 2>&1 | grep -v Warn
