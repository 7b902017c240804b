#!/usr/bin/env bash
# Nsight Compute of one forward cell, on the device: CELL="d N causal" (default "256 512 1"),
# IMPLS (default "ours sdpa"; also cudnn, fa4 after `source .peers/b/env.sh`), SOURCE=1 adds
# our kernel's SASS source view (ncu_source_top.py; build with FLASHATTN_LINEINFO=1 for lines).
# Writes $OUT/ncu_fwd_d<d>_N<N>_c<c>.log; a digest of the main counters last.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
set -- ${CELL:-256 512 1}
f="$OUT/ncu_fwd_d$1_N$2_c$3.log"; : > "$f"
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section LaunchStats --section Occupancy \
  --section MemoryWorkloadAnalysis_Tables --section InstructionStats"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
for impl in ${IMPLS:-ours sdpa}; do
  case $impl in  # the attention kernel's name: ours fwd_kernel_sm90 / _sm80, the peers' own
    ours) re="fwd_kernel" ;; sdpa) re="flash_fwd_kernel" ;; cudnn) re="sdpa|fprop|fmha|cudnn" ;;
    fa4) re="[Ff]orward|[Ff]wd" ;; *) echo "unknown impl $impl"; continue ;;
  esac
  echo "######## $impl" >> "$f"
  timeout ${NCU_LIMIT:-150} ncu --clock-control none -k "regex:$re" --launch-skip 3 --launch-count 1 \
    $SEC python3 tools/device/fwd_one.py $impl "$@" >> "$f" 2>&1
done
if [ "${SOURCE:-1}" = 1 ]; then
  timeout ${NCU_LIMIT:-150} ncu --clock-control none -k regex:fwd_kernel --launch-skip 3 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -f -o /tmp/src_fwd \
    python3 tools/device/fwd_one.py ours "$@" > /dev/null 2>&1 &&
    ncu -i /tmp/src_fwd.ncu-rep --page source --csv --print-source sass > /tmp/src_fwd.csv 2>&1
  python3 tools/device/ncu_source_top.py /tmp/src_fwd.csv >> "$f" 2>&1
fi
grep -E "########|  [a-z_0-9]*(fwd|kernel|fmha|Forward)[A-Za-z_0-9]*|Duration|Registers Per|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|No Eligible" "$f" | head -80
