#!/usr/bin/env bash
# One H200 call for the sm90 forward: the self-tests (one per head dim 64 / 128 / 256: every
# candidate tile against float64, then timed beside sm80; SELFTEST_DIMS picks) built beside
# the package (machine's own environment), then the
# package's sm90 tests and the sanitizers on the sm90 cases (SKIP_PKG=1: the self-tests alone;
# SELFTEST_ARGS, e.g. --cold, times them with inputs rotated past the L2 as the benchmark does). Stashes FA4's first half when
# carried (.peers/a) so that a benchmark call can follow at once. Summary last.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/st
if [ -f .peers/a/part_aa ]; then mkdir -p /tmp/fa4 && cp .peers/a/part_aa /tmp/fa4/; fi
A="-std=c++17 -O3 --expt-relaxed-constexpr -Icsrc -Itools/selftest ${SELFTEST_FLAGS:-}"
t0=$(date +%s)
( for f in csrc/sm80/dispatch_fwd_sm80.cu csrc/instantiations/fwd_sm80_*.cu; do
    nvcc $A -gencode=arch=compute_90,code=sm_90 -c $f -o /tmp/st/$(basename $f .cu).o & done
  for D in ${SELFTEST_DIMS:-64 128 256}; do
    nvcc $A -DSELFTEST_D=$D -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
      -c tools/selftest/selftest_fwd_sm90.cu -o /tmp/st/main$D.o > "$OUT/selftest_ptxas$D.log" 2>&1 &
  done; wait
  for D in ${SELFTEST_DIMS:-64 128 256}; do
    nvcc /tmp/st/main$D.o /tmp/st/*sm80*.o -o /tmp/st/selftest_fwd_sm90_d$D; done ) > "$OUT/selftest_build.log" 2>&1 &
st_pid=$!
if [ -z "${SKIP_PKG:-}" ]; then  # SKIP_PKG=1: the self-tests alone (no package build, tests, sanitizers)
  rm -f flashattn/_C*.so
  MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -v -e . > "$OUT/build.log" 2>&1
  echo "== build rc=$? ($(( $(date +%s) - t0 )) s, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>})"
fi
wait $st_pid; echo "== selftest build rc=$?"; tail -n 5 "$OUT/selftest_build.log"
for D in ${SELFTEST_DIMS:-64 128 256}; do
  grep -E "spill" "$OUT/selftest_ptxas$D.log" | sort | uniq -c
  /tmp/st/selftest_fwd_sm90_d$D ${SELFTEST_ARGS:-} > "$OUT/selftest_d$D.log" 2>&1; echo "== selftest d$D rc=$?"
  grep -E "FAIL|failed" "$OUT/selftest_d$D.log" | head -20; tail -n 14 "$OUT/selftest_d$D.log"
done
[ -n "${SKIP_PKG:-}" ] && { echo "== total $(( $(date +%s) - t0 )) s"; exit 0; }
for force in ${TEST_FORCE:-auto sm90}; do
  t1=$(date +%s)
  FLASHATTN_FORCE_BACKEND=$force FLASHATTN_REQUIRE_CUDA=1 PYTHONPATH=$PWD python3 -m pytest -q -rfEs \
    -p no:cacheprovider -n 8 tests -k "${TEST_K:-cuda}" > "$OUT/tests_$force.log" 2>&1
  echo "== tests ($force) rc=$?: $(tail -n 1 "$OUT/tests_$force.log") ($(( $(date +%s) - t1 )) s)"
  grep -E "^(FAILED|ERROR)" "$OUT/tests_$force.log" | head -20
  grep -E "^E  " "$OUT/tests_$force.log" | head -40
done
grep -E "^SKIPPED" "$OUT/tests_sm90.log" 2>/dev/null | sed -E 's/.*(does not take this call: [^(]*).*/\1/' \
  | sort | uniq -c | sort -rn | head -8
[ -n "${NO_SANITIZE:-}" ] && { echo "== total $(( $(date +%s) - t0 )) s"; exit 0; }
for tool in memcheck racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD compute-sanitizer --tool $tool \
    --error-exitcode 17 python3 tools/sanitize_cases.py --sm90 > "$OUT/sanitize_$tool.log" 2>&1
  echo "== $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -n 1)"
done
echo "== total $(( $(date +%s) - t0 )) s"
