#!/usr/bin/env bash
# One device call for kernel tuning: builds the standalone self-tests (no torch build), runs
# their benchmarks and an Nsight Compute profile of our backward against SDPA flash's.
# Env: NCU=1 (profile PROFILE_CELLS, "d N causal" triples, default "128 8192 0;64 8192 0"),
# DIAG=1 (stage-left-out timings), TILES=1 (selftest_bwd --tiles / --tiles256), FWD=0,
# BWD_BENCH= (correctness only, no timing grid).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
A="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90,code=sm_90 -I csrc ${EXTRA_NVCC:-}"
B=/tmp/st; mkdir -p $B
t0=$(date +%s)
for d in 32 64 96 128 192 256; do
  nvcc $A -c csrc/instantiations/bwd_sm80_hdim${d}_bf16.cu -o $B/h$d.o &
done
nvcc $A -c tools/selftest_bwd_sm80.cu -o $B/st.o &
[ "${FWD:-1}" = 1 ] && nvcc $A tools/selftest_fwd_sm80.cu csrc/sm80/dispatch_fwd_sm80.cu \
  csrc/instantiations/fwd_*.cu -o $B/selftest_fwd &
wait
nvcc $A $B/st.o $B/h*.o -o $B/selftest_bwd || exit 1
echo "== compiled in $(( $(date +%s) - t0 )) s"
$B/selftest_bwd ${BWD_BENCH---bench} > "$OUT/bwd_bench.log" 2>&1; echo "bwd selftest rc=$?"
grep -E "FAIL|failed|bench" "$OUT/bwd_bench.log"
if [ "${TILES:-0}" = 1 ]; then  # candidate tile shapes: checked on their bucket's cases, timed
  $B/selftest_bwd --tiles 2>&1 | grep -vE " ok$"
  $B/selftest_bwd --tiles256
fi
if [ "${FWD:-1}" = 1 ]; then
  $B/selftest_fwd --no-bench --variants > "$OUT/fwd_variants.log" 2>&1; echo "fwd selftest rc=$?"
  grep -vE " ok$" "$OUT/fwd_variants.log" | tail -n 60
fi
# Diagnostics: the backward with a stage left out (wrong results; timing only).
diag() {  # name, sed expression on kernel_bwd_sm80.cuh
  rm -rf /tmp/diag_$1; cp -r csrc /tmp/diag_$1; sed -i "$2" /tmp/diag_$1/sm80/kernel_bwd_sm80.cuh
  for d in 64 128; do
    nvcc ${A/-I csrc/-I /tmp/diag_$1} -c /tmp/diag_$1/instantiations/bwd_sm80_hdim${d}_bf16.cu -o /tmp/diag_$1/h$d.o &
  done
}
if [ "${DIAG:-0}" = 1 ]; then
  diag no_dq 's/^    red_acc<kMT3/    if (0) red_acc<kMT3/'
  diag dq_noatomic 's/^    red_acc<kMT3/    if (p.softcap == -1.f) red_acc<kMT3/'
  wait
  for v in no_dq dq_noatomic; do
    nvcc $A $B/st.o $B/h32.o $B/h96.o $B/h192.o $B/h256.o /tmp/diag_$v/h64.o /tmp/diag_$v/h128.o -o $B/bwd_$v
    for d in 64 128; do for c in 0 1; do
      echo "$v: $($B/bwd_$v --one $d 8192 $c 0)"; echo "base: $($B/selftest_bwd --one $d 8192 $c 0)"
    done; done
  done
fi
if [ "${NCU:-0}" = 1 ]; then
  SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats \
    --section Occupancy"
  IFS=';' read -ra cells <<< "${PROFILE_CELLS:-128 8192 0;64 8192 0}"
  for cell in "${cells[@]}"; do
    set -- $cell
    ncu --clock-control none -k regex:bwd_main_kernel --launch-skip 4 --launch-count 1 $SEC \
      $B/selftest_bwd --one $1 $2 $3 0 > "$OUT/ncu_ours_d$1_N$2_c$3.log" 2>&1
    ncu --clock-control none -k regex:flash_bwd_dq_dk_dv --launch-skip 3 --launch-count 1 $SEC \
      python3 tools/sdpa_bwd_one.py $1 $2 $3 > "$OUT/ncu_sdpa_d$1_N$2_c$3.log" 2>&1
    echo "== ncu d$1 N$2 causal$3 done"
  done
fi
echo "== total $(( $(date +%s) - t0 )) s"
