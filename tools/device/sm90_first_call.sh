#!/usr/bin/env bash
# One H200 call that checks what has not yet run on a GPU: the sm90 forward's self-test
# (SELFTEST_DIMS, default 64) and the package's forced-sm90 CUDA tests + sanitizers
# (sm90_fwd_ab.sh), the Hopper backward's self-test (sm90_bwd_selftest.sh, built under the
# forward's work). Every log goes into $OUT/logs.tgz (the device returns at most 8 files).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; L=/tmp/logs; mkdir -p "$OUT" $L/fwd $L/bwd
t0=$(date +%s)
( OUT=$L/bwd BWD_STAGE=build bash tools/device/sm90_bwd_selftest.sh > $L/bwd_build.out 2>&1 ) &
b=$!
OUT=$L/fwd SELFTEST_DIMS="${SELFTEST_DIMS:-64}" TEST_FORCE="${TEST_FORCE:-sm90}" \
  timeout ${FWD_LIMIT:-420} bash tools/device/sm90_fwd_ab.sh 2>&1 | tee $L/fwd.out
wait $b; echo "== bwd build rc=$?"; cat $L/bwd_build.out
OUT=$L/bwd BWD_STAGE=run timeout ${BWD_LIMIT:-160} bash tools/device/sm90_bwd_selftest.sh 2>&1 | tee $L/bwd.out
tar czf "$OUT/logs.tgz" -C $L .
echo "== first call total $(( $(date +%s) - t0 )) s"
