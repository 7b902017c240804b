#!/usr/bin/env bash
# Nsight Compute of our forward against SDPA flash's on one cell (the carried build), on the
# device: CELL="d N causal" (default "256 512 1"). Writes $OUT/ncu_fwd_d<d>_N<N>_c<c>.log.
# Its source view (ncu_source_top.py) needs source lines: build with FLASHATTN_LINEINFO=1.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
set -- ${CELL:-256 512 1}
f="$OUT/ncu_fwd_d$1_N$2_c$3.log"
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy --section MemoryWorkloadAnalysis_Tables --section InstructionStats"
export PYTHONPATH=$PWD
ncu --clock-control none -k regex:fwd_kernel --launch-skip 3 --launch-count 1 $SEC \
  python3 tools/device/fwd_one.py ours "$@" > "$f" 2>&1
ncu --clock-control none -k regex:flash_fwd_kernel --launch-skip 3 --launch-count 1 $SEC \
  python3 tools/device/fwd_one.py sdpa "$@" >> "$f" 2>&1
ncu --clock-control none -k regex:fwd_kernel --launch-skip 3 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -f -o /tmp/src_fwd \
  python3 tools/device/fwd_one.py ours "$@" > /dev/null 2>&1 &&
  ncu -i /tmp/src_fwd.ncu-rep --page source --csv --print-source sass > /tmp/src_fwd.csv 2>&1
python3 tools/device/ncu_source_top.py /tmp/src_fwd.csv >> "$f" 2>&1
grep -E "fwd_kernel|Duration|Elapsed Cycles|Registers Per|Achieved Occupancy|Theoretical Occ|Compute \(SM\) Throughput|Memory Throughput|Warp Cycles Per Issued|Block Limit" "$f" | head -60
