#!/usr/bin/env bash
# Nsight Compute of the split-KV decode kernel on one cell, contiguous against paged (the
# carried build): CELL="B N page" (default "32 16384 16"). Writes $OUT/ncu_decode.log, and the
# source view's top stalls (ncu_source_top.py; needs a FLASHATTN_LINEINFO=1 build).
set -uo pipefail
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
set -- ${CELL:-32 16384 16}
f="$OUT/ncu_decode.log"
SEC="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy --section MemoryWorkloadAnalysis_Tables --section InstructionStats"
export PYTHONPATH=$PWD
for page in 0 "$3"; do
  echo "==== B=$1 N=$2 page=$page" >> "$f"
  ncu --clock-control none -k regex:decode_kernel --launch-skip 2 --launch-count 1 $SEC \
    python3 tools/device/decode_one.py "$1" "$2" "$page" >> "$f" 2>&1
done
ncu --clock-control none -k regex:decode_kernel --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -f -o /tmp/src_dec \
  python3 tools/device/decode_one.py "$1" "$2" "$3" > /dev/null 2>&1 &&
  ncu -i /tmp/src_dec.ncu-rep --page source --csv --print-source sass > /tmp/src_dec.csv 2>&1
python3 tools/device/ncu_source_top.py /tmp/src_dec.csv >> "$f" 2>&1
grep -E "====|Duration|Registers Per|Achieved Occupancy|Memory Throughput|DRAM Throughput|Warp Cycles Per Issued|Block Limit|Stall" "$f" | head -60
