#!/usr/bin/env bash
# One H200 call for the sm90 forward: the self-test (every consumer schedule against float64,
# then timed beside sm80) built beside the package (machine's own environment), then the
# package's sm90 tests and the sanitizers on the sm90 cases. Stashes FA4's first half when
# carried (.peers/a) so that a benchmark call can follow at once. Summary last.
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/st
if [ -f .peers/a/part_aa ]; then mkdir -p /tmp/fa4 && cp .peers/a/part_aa /tmp/fa4/; fi
A="-std=c++17 -O3 --expt-relaxed-constexpr -Icsrc -Itools/selftest ${SELFTEST_FLAGS:-}"
t0=$(date +%s)
( for f in csrc/sm80/dispatch_fwd_sm80.cu csrc/instantiations/fwd_sm80_*.cu; do
    nvcc $A -gencode=arch=compute_90,code=sm_90 -c $f -o /tmp/st/$(basename $f .cu).o & done
  nvcc $A -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c tools/selftest/selftest_fwd_sm90.cu \
    -o /tmp/st/selftest90.o > "$OUT/selftest_ptxas.log" 2>&1 & wait
  nvcc /tmp/st/*.o -o /tmp/st/selftest_fwd_sm90 ) > "$OUT/selftest_build.log" 2>&1 &
st_pid=$!
rm -f flashattn/_C*.so
MAX_JOBS=16 python3 -m pip install --no-build-isolation --no-deps -v -e . > "$OUT/build.log" 2>&1
echo "== build rc=$? ($(( $(date +%s) - t0 )) s, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>})"
wait $st_pid; echo "== selftest build rc=$?"; grep -E "spill|registers" "$OUT/selftest_ptxas.log" | sort | uniq -c
/tmp/st/selftest_fwd_sm90 > "$OUT/selftest.log" 2>&1; echo "== selftest rc=$?"
grep -E "FAIL|failed" "$OUT/selftest.log"; tail -n 12 "$OUT/selftest.log"
FLASHATTN_REQUIRE_CUDA=1 PYTHONPATH=$PWD python3 -m pytest -q -x -p no:cacheprovider -n 8 \
  tests/test_backend.py tests/test_attention.py tests/test_api.py -k cuda > "$OUT/tests.log" 2>&1
echo "== tests rc=$?: $(tail -n 1 "$OUT/tests.log")"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head
for tool in memcheck racecheck synccheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD compute-sanitizer --tool $tool \
    --error-exitcode 17 python3 tools/sanitize_cases.py --sm90 > "$OUT/sanitize_$tool.log" 2>&1
  echo "== $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -n 1)"
done
echo "== total $(( $(date +%s) - t0 )) s"
