#!/usr/bin/env bash
# One GPU call: the FP8 d256 long-key tile (tile_fwd_sm90.h's FLASHATTN_SM90_FP8_D256_LONG:
# 128 x 128, 1 without ping-pong, 2 with; 2s with SKIP_RESCALE too) against the package's
# 128 x 64, through tools/device/ab_builds.sh: the variants' trees built for d 256 only beside
# the package (BUILD=0 on a warm machine that built it), test_fp8's CUDA cases on each
# (test_fp8_forward_long_tile takes the long tile at d 240 / 256 at every length), then the
# d 256 FP8 cells with FLASHATTN_SM90_FP8_LONG=1 (the long tile at every length, so that one
# run shows where it pays; the package's own rule is >= 8192 keys).
# Usage: BUILD=0 bash tools/device/fp8_d256_ab.sh (~6 min).
set -uo pipefail
export FLASHATTN_SM90_FP8_LONG=1
VARIANTS="${VARIANTS:-l1:-DFLASHATTN_SM90_FP8_D256_LONG=1:256 l2:-DFLASHATTN_SM90_FP8_D256_LONG=2:256 l2s:-DFLASHATTN_SM90_FP8_D256_LONG=2+-DFLASHATTN_SM90_SKIP_RESCALE=1:256}" \
  AB_JOBS=${AB_JOBS:-5} TEST_LIMIT=${TEST_LIMIT:-150} \
  TEST_ARGS="tests/test_fp8.py -k cuda" \
  BENCH_ARGS="--dtype fp8 --d 256 --N 1024 2048 4096 8192 16384 --causal 0 1 --impls flashattn" \
  bash tools/device/ab_builds.sh
