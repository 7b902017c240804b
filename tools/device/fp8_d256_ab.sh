#!/usr/bin/env bash
# One GPU call: the FP8 d256 long-key tile (tile_fwd_sm90.h's FLASHATTN_SM90_FP8_D256_LONG) by
# build, through tools/device/ab_builds.sh. Since c17d416 the package (the base) takes 128 x
# 128 without ping-pong (=1) from 2048 keys; the variants, built for d 128 and 256 beside it
# (BUILD=0 on a warm machine that built it; d 128 for the benchmark's FP8 probe): t64 (=0, the
# 128 x 64 tile alone) and pp (=2, 128 x 128 with ping-pong). test_fp8's CUDA cases on the
# base, its long-tile cases on each variant, then the d 256 FP8 cells with
# FLASHATTN_SM90_FP8_LONG=1 (the long tile at every length). The 2026-12-07 run (the base then
# 128 x 64, variants =1 / =2): results/h100_fp8_d256_ab_834a95b.txt.
# Usage: BUILD=0 bash tools/device/fp8_d256_ab.sh (~5 min).
set -uo pipefail
export FLASHATTN_SM90_FP8_LONG=1
VARIANTS="${VARIANTS:-t64:-DFLASHATTN_SM90_FP8_D256_LONG=0:128,256 pp:-DFLASHATTN_SM90_FP8_D256_LONG=2:128,256}" \
  AB_JOBS=${AB_JOBS:-8} TEST_LIMIT=${TEST_LIMIT:-150} \
  TEST_ARGS="tests/test_fp8.py -k cuda" VARIANT_TEST_ARGS="tests/test_fp8.py -k long_tile" \
  BENCH_ARGS="--dtype fp8 --d 256 --N 1024 2048 4096 8192 16384 --causal 0 1 --impls flashattn" \
  bash tools/device/ab_builds.sh
