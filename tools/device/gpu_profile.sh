#!/usr/bin/env bash
# One device call for kernel tuning: builds the standalone self-tests (no torch build), runs
# their benchmarks and an Nsight Compute profile of our backward against SDPA flash's.
# Env: NCU=1 (profile PROFILE_CELLS, "d N causal" triples, default "128 8192 0;64 8192 0"),
# VARIANTS (A/B of sed-edited copies, see below), TILES=1 (selftest_bwd --tiles / --tiles256),
# FWD=0, BWD_BENCH= (correctness only, no timing grid).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
A="-std=c++17 -O3 -lineinfo -gencode=arch=compute_90,code=sm_90 -I csrc ${EXTRA_NVCC:-}"
B=/tmp/st; mkdir -p $B
t0=$(date +%s)
for d in 32 64 96 128 192 256; do
  nvcc $A -c csrc/instantiations/bwd_sm80_hdim${d}_bf16.cu -o $B/h$d.o &
done
nvcc $A -c tools/selftest/selftest_bwd_sm80.cu -o $B/st.o &
[ "${FWD:-1}" = 1 ] && nvcc $A tools/selftest/selftest_fwd_sm80.cu csrc/sm80/dispatch_fwd_sm80.cu \
  csrc/instantiations/fwd_sm80_*.cu -o $B/selftest_fwd &
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
# Variants of the backward (csrc copied, one sed applied): VARIANTS, ";"-separated entries
# name|file under csrc|sed expr; each is timed --one against the base, interleaved.
variant() {  # name, file, sed expression
  rm -rf /tmp/var_$1; cp -r csrc /tmp/var_$1; sed -i "$3" /tmp/var_$1/$2
  cmp -s csrc/$2 /tmp/var_$1/$2 && echo "variant $1: the sed changed nothing" && return
  for d in 64 128; do
    nvcc ${A/-I csrc/-I /tmp/var_$1} -c /tmp/var_$1/instantiations/bwd_sm80_hdim${d}_bf16.cu -o /tmp/var_$1/h$d.o &
  done
}
VLIST="${VARIANTS:-}"
names=()
IFS=';' read -ra ventries <<< "$VLIST"
for e in "${ventries[@]}"; do
  [ -z "$e" ] && continue
  IFS='|' read -r vn vf vs <<< "$e"; variant "$vn" "$vf" "$vs"; names+=("$vn")
done
wait
for v in "${names[@]}"; do
  [ -f /tmp/var_$v/h64.o ] || continue
  nvcc $A $B/st.o $B/h32.o $B/h96.o $B/h192.o $B/h256.o /tmp/var_$v/h64.o /tmp/var_$v/h128.o -o $B/bwd_$v || continue
  for cell in ${VCELLS:-64,8192,0 64,8192,1 128,8192,0 128,8192,1 128,2048,0}; do
    IFS=, read -r d n c <<< "$cell"
    for rep in 1 2; do
      echo "$v: $($B/bwd_$v --one $d $n $c 0)"; echo "base: $($B/selftest_bwd --one $d $n $c 0)"
    done
  done
done
if [ "${NCU:-0}" = 1 ]; then
  SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --section LaunchStats \
    --section Occupancy"
  IFS=';' read -ra cells <<< "${PROFILE_CELLS:-128 8192 0;64 8192 0}"
  for cell in "${cells[@]}"; do
    set -- $cell
    f="$OUT/ncu_d$1_N$2_c$3.log"
    ncu --clock-control none -k regex:bwd_main_kernel --launch-skip 4 --launch-count 1 $SEC \
      --print-details all $B/selftest_bwd --one $1 $2 $3 0 > "$f" 2>&1
    ncu --clock-control none -k regex:flash_bwd_dq_dk_dv --launch-skip 3 --launch-count 1 $SEC \
      --print-details all python3 tools/device/sdpa_bwd_one.py $1 $2 $3 >> "$f" 2>&1
    # Executed instructions per SASS opcode (where the two kernels' instruction counts differ).
    OPC="--metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum --print-metric-instances details"
    ncu --clock-control none -k regex:bwd_main_kernel --launch-skip 4 --launch-count 1 $OPC \
      $B/selftest_bwd --one $1 $2 $3 0 >> "$f" 2>&1
    ncu --clock-control none -k regex:flash_bwd_dq_dk_dv --launch-skip 3 --launch-count 1 $OPC \
      python3 tools/device/sdpa_bwd_one.py $1 $2 $3 >> "$f" 2>&1
    # Stall samples per SASS instruction (ours only): where the warps wait.
    ncu --clock-control none -k regex:bwd_main_kernel --launch-skip 4 --launch-count 1 \
      --section SourceCounters --section WarpStateStats -f -o /tmp/src_d$1 \
      $B/selftest_bwd --one $1 $2 $3 0 > /dev/null 2>&1 &&
      ncu -i /tmp/src_d$1.ncu-rep --page source --csv --print-source sass > /tmp/src_d$1.csv 2>&1
    python3 tools/device/ncu_source_top.py /tmp/src_d$1.csv >> "$f" 2>&1
    echo "== ncu d$1 N$2 causal$3 done"
  done
fi
echo "== total $(( $(date +%s) - t0 )) s"
