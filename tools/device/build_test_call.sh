#!/usr/bin/env bash
# One H200 call: the package built with the machine's own environment, then CUDA test sets
# (TEST_SETS: "name:force:pytest-args" entries, run in turn; the pytest arguments name the
# tests, "+" for a space, shell quoting kept, e.g. "kv:auto:tests+-k+'cuda+and+not+dropout'"),
# then the Hopper backward's
# self-test (BWD=1, sm90_bwd_selftest.sh; its build runs under the package build), and
# compute-sanitizer memcheck over tools/sanitize_cases.py (SANITIZE=1; SANITIZE_ARGS, e.g.
# "--decode" or "--sm90", several runs separated by commas). Stashes FA4's first
# half when carried (.peers/a) so that a benchmark call can follow. All logs in
# $OUT/logs.tgz (the device returns at most 8 files); a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT="${OUT:-/tmp/out}"; L=/tmp/logs; mkdir -p "$OUT" $L/bwd
if [ -f .peers/a/part_aa ]; then mkdir -p /tmp/fa4 && cp .peers/a/part_aa /tmp/fa4/; fi
t0=$(date +%s)
b=""
if [ "${BWD:-1}" = 1 ]; then
  ( OUT=$L/bwd BWD_STAGE=build bash tools/device/sm90_bwd_selftest.sh > $L/bwd_build.out 2>&1 ) &
  b=$!
fi
rm -f flashattn/_C*.so
MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -v -e . > $L/build.log 2>&1
echo "== build rc=$? ($(( $(date +%s) - t0 )) s, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>})"
grep -m1 -oE 'archs .*sources \([0-9]+ sm90\)' $L/build.log
grep -E " error|error:" $L/build.log | head -20
for set in ${TEST_SETS:-"cuda:auto:tests+-k+cuda"}; do
  IFS=: read -r name force args <<< "$set"
  args=${args//+/ }
  t1=$(date +%s)
  FLASHATTN_FORCE_BACKEND=$force FLASHATTN_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout -s INT -k 20 ${TEST_LIMIT:-300} \
    bash -c "exec python3 -m pytest -q -rfEs -p no:cacheprovider -o faulthandler_timeout=${TEST_HANG_S:-120} -n 8 ${PYTEST_EXTRA:-} $args" > $L/tests_$name.log 2>&1
  echo "== tests $name ($force, $args) rc=$?: $(tail -n 1 $L/tests_$name.log) ($(( $(date +%s) - t1 )) s)"
  grep -E "^(FAILED|ERROR)" $L/tests_$name.log | head -20
  grep -E "^E  " $L/tests_$name.log | head -30
done
if [ -n "$b" ]; then
  wait $b; echo "== bwd build rc=$?"; cat $L/bwd_build.out
  OUT=$L/bwd BWD_STAGE=run timeout ${BWD_LIMIT:-150} bash tools/device/sm90_bwd_selftest.sh 2>&1 | tee $L/bwd.out
fi
if [ "${SANITIZE:-0}" = 1 ]; then
  IFS=, read -ra sargs <<< "${SANITIZE_ARGS:-}"
  i=0
  for a in "${sargs[@]:-}"; do
    i=$((i + 1))
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD timeout ${SANITIZE_LIMIT:-200} \
      compute-sanitizer --tool memcheck --error-exitcode 17 python3 tools/sanitize_cases.py $a \
      > $L/sanitize_memcheck$i.log 2>&1
    echo "== memcheck ($a) rc=$?: $(grep -E 'ERROR SUMMARY' $L/sanitize_memcheck$i.log | tail -n 1)"
    grep -E "Invalid|Error|Traceback" $L/sanitize_memcheck$i.log | head -8
  done
fi
tar czf "$OUT/logs.tgz" -C $L .
echo "== total $(( $(date +%s) - t0 )) s"
