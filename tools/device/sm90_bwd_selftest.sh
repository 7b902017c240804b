#!/usr/bin/env bash
# One H200 call for the Hopper backward (csrc/sm90/kernel_bwd_sm90.cuh):
# the sm80 backward's self-test built with -DSELFTEST_SM90, its --sm90 mode (the sm90 main
# kernel between the sm80 preprocessing and conversions, against float64 on the cases it
# takes), then it and its timing-only ablations timed beside the sm80 backward
# (SM90_BWD_ARGS="" skips the timing); then compute-sanitizer memcheck and racecheck on the
# candidate's checks of the smaller cases (--small). BWD_STAGE=build builds only,
# BWD_STAGE=run runs an earlier build (so the build can go under another job). D256=1 (the
# default) adds the d 256 draft (kernel_bwd_d256_sm90.cuh) and the sm80 d256 backward around it.
set -uo pipefail
BWD_STAGE="${BWD_STAGE:-all}"
export PATH=/usr/local/cuda/bin:$PATH
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT" /tmp/stb
A="-std=c++17 -O3 --expt-relaxed-constexpr -Icsrc -Itools/selftest -DSELFTEST_ONLY_64_128"
DIMS="64 128"
if [ "${D256:-1}" = 1 ]; then A="$A -DSELFTEST_D256"; DIMS="64 128 256"; fi
t0=$(date +%s)
if [ "$BWD_STAGE" != run ]; then
for d in $DIMS; do
  nvcc $A -gencode=arch=compute_90,code=sm_90 -c csrc/instantiations/bwd_sm80_hdim${d}_bf16.cu \
    -o /tmp/stb/h$d.o & done
nvcc $A -DSELFTEST_SM90 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v \
  -c tools/selftest/selftest_bwd_sm80.cu -o /tmp/stb/main.o > "$OUT/bwd90_ptxas.log" 2>&1
wait
nvcc /tmp/stb/main.o $(for d in $DIMS; do echo /tmp/stb/h$d.o; done) -o /tmp/stb/selftest_bwd90 || exit 1
echo "== built ($(( $(date +%s) - t0 )) s)"; grep -E "spill|C75" "$OUT/bwd90_ptxas.log" | sort | uniq -c
fi
[ "$BWD_STAGE" = build ] && exit 0
/tmp/stb/selftest_bwd90 --sm90 ${SM90_BWD_ARGS---bench} > "$OUT/bwd90.log" 2>&1
echo "== selftest rc=$?"; grep -E "FAIL|failed|bench" "$OUT/bwd90.log" | head -60
for tool in memcheck racecheck; do
  compute-sanitizer --tool $tool --error-exitcode 17 /tmp/stb/selftest_bwd90 --sm90 --small \
    > "$OUT/bwd90_$tool.log" 2>&1
  echo "== $tool rc=$?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/bwd90_$tool.log" | tail -n 1)"
done
echo "== total $(( $(date +%s) - t0 )) s"
