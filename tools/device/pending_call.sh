#!/usr/bin/env bash
# One device call for what was written without a GPU (2026-12-07, second session), sized for
# the 600 s limit: the package built with the machine's own environment, the CUDA tests (they
# include the persistent backward's, the batched combine's and the PDL decode graph's),
# memcheck over the sm90 and decode cases, then the A/Bs of the opt-in switches:
# FLASHATTN_SM90_BWD_PERSIST (bwd_persist_ab.py), and the decode combine's loops and PDL in
# kernel time (kernel_times.py) and in the benchmark's timing (decode_cells.py). Stage limits
# via the environment (TEST_LIMIT, SANITIZE_LIMIT, AB_LIMIT); carry .peers/a if a benchmark
# call follows. Usage: bash tools/device/pending_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
BWD=0 SANITIZE=1 SANITIZE_ARGS="--sm90,--decode" SANITIZE_LIMIT=${SANITIZE_LIMIT:-80} \
  TEST_LIMIT=${TEST_LIMIT:-120} TEST_HANG_S=60 bash tools/device/build_test_call.sh
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
echo "== persistent backward A/B"
timeout "${AB_LIMIT:-90}" python3 tools/device/bwd_persist_ab.py --rounds 3 2>&1 | grep -v Warn
for form in "FLASHATTN_DECODE_COMBINE=par" "FLASHATTN_DECODE_COMBINE=batch" \
            "FLASHATTN_DECODE_PDL=1" "FLASHATTN_DECODE_COMBINE=batch FLASHATTN_DECODE_PDL=1"; do
  echo "== decode kernel times, $form"
  env $form timeout 30 python3 tools/device/kernel_times.py --cells dec:1:4096 dec:1:16384 \
    dec:8:4096 2>&1 | grep -E "us/call|combine|decode_kernel"
done
for form in "FLASHATTN_DECODE_COMBINE=par" "FLASHATTN_DECODE_COMBINE=batch FLASHATTN_DECODE_PDL=1"; do
  echo "== decode cells, $form"
  env $form timeout 40 python3 tools/device/decode_cells.py --cells 1x4096 1x16384 8x4096 2>&1 |
    tail -4
done
