#!/usr/bin/env bash
# Nsight Compute of one backward cell's main kernel, on the device: CELL="d N causal" (default
# "128 16384 1"), IMPLS (default "ours fa4 cudnn"; fa4 after `source .peers/b/env.sh`;
# sparse:<mask> / flex:<mask>, bwd_one.py's block-sparse cells, e.g. CELL="128 2048 0"
# IMPLS="sparse:random25 flex:random25 ours"). The
# sections of ncu_fwd.sh plus shared-memory bank conflicts (the dQ staging's, NOTES "The d128
# backward against FA3 / FA4"). Writes $OUT/ncu_bwd_d<d>_N<N>_c<c>.log; a digest last.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
set -- ${CELL:-128 16384 1}
f="$OUT/ncu_bwd_d$1_N$2_c$3.log"; : > "$f"
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis_Tables --section InstructionStats"
MET="--metrics l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for impl in ${IMPLS:-ours fa4 cudnn}; do
  case $impl in  # the backward main kernel's name: ours bwd_kernel_sm90 / bwd_main_kernel (sm80)
    ours|sparse:*) re="bwd_kernel|bwd_main_kernel" ;; sdpa) re="flash_bwd" ;; flex:*) re="triton" ;;
    cudnn) re="dgrad|bprop|sdpa|cudnn" ;; fa4) re="[Bb]ackward|[Bb]wd" ;;
    *) echo "unknown impl $impl"; continue ;;
  esac
  echo "######## $impl" >> "$f"
  timeout ${NCU_LIMIT:-150} ncu --clock-control none -k "regex:$re" --launch-skip 2 --launch-count 1 \
    $SEC $MET python3 tools/device/bwd_one.py $impl "$@" >> "$f" 2>&1
done
grep -E "########|  [a-z_0-9]*(bwd|kernel|Backward|dgrad|bprop)[A-Za-z_0-9]*|Duration|Registers Per|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|No Eligible|bank_conflicts|wavefronts" "$f" | head -90
