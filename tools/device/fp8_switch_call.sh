#!/usr/bin/env bash
# One GPU call on a warm machine that has built the package (e.g. after det_hang_call.sh): the
# FP8 forward's two opt-in switches of 2026-12-07 (seventh session), which no GPU has run:
# FLASHATTN_SM90_FP8_VCHIP=1 (V^T on chip by ldmatrix.trans / byte permutes / stmatrix,
# transpose_v_fp8_sm90.cuh) and FLASHATTN_SM90_FP8_SHORT=1 (d64's 128 x 128 tile for causal /
# windowed calls up to 1k rows). In order, each under a time limit, a summary line each:
#   1. test_fp8's CUDA cases (the vchip and short-tile cases among them);
#   2. compute-sanitizer memcheck, then racecheck, over tools/sanitize_cases.py --sm90 (its
#      FP8 block runs both switches' cases);
#   3. fwd_env_ab.py --dtype fp8 for each switch, beside our bf16 forward on the same values
#      (VCHIP: d 64 / 128 / 256, 512-16k, causal and not; SHORT: d 64 causal 512-2k).
# Summary to $OUT/summary.txt as it is written, logs in $OUT/logs.tgz. DEADLINE (default
# 560 s). A machine without the package's build (call 1's lost) gets a lean one first (~1-2
# min). Usage: bash tools/device/fp8_switch_call.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH
OUT="${OUT:-/tmp/out}"; L=/tmp/logs_fp8; mkdir -p "$OUT" $L
t0=$(date +%s); DEADLINE=${DEADLINE:-560}
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
exec > >(tee "$OUT/summary.txt") 2>&1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
# A machine that lost call 1's build (a fresh one): a lean build for these tests (head dims 64 /
# 128 / 256, FP8 on, no dropout or block-sparse kernels; the other head dims' cases then skip).
if ! python3 -c "import flashattn, torch; assert flashattn.kernel_path(torch.empty(1, 1, 1, 64,
       device='cuda', dtype=torch.bfloat16), *[torch.empty(1, 1, 1, 64, device='cuda',
       dtype=torch.bfloat16)] * 2) == 'sm90'" > /dev/null 2>&1; then
  t1=$(date +%s)
  FLASHATTN_HEADDIMS=64,128,256 FLASHATTN_DISABLE_DROPOUT=1 FLASHATTN_DISABLE_BLOCK_SPARSE=1 \
    MAX_JOBS=${MAX_JOBS:-14} python3 -m pip install --no-build-isolation --no-deps -v -e . \
    > "$L/build.log" 2>&1
  echo "== lean build rc=$? ($(( $(date +%s) - t1 )) s)"
fi
python3 -c "import flashattn, torch; print(flashattn.__file__, torch.cuda.get_device_name())" ||
  { echo "== no usable build here"; exit 1; }

step() {  # name, limit (s), command...
  local name=$1 lim=$2; shift 2
  [ "$lim" -gt "$(( $(left) - 10 ))" ] && lim=$(( $(left) - 10 ))
  if [ "$lim" -lt 20 ]; then echo "== $name: no time left"; return 99; fi
  local t1; t1=$(date +%s)
  timeout -s INT -k 10 "$lim" "$@" > "$L/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc ($(( $(date +%s) - t1 )) s, limit $lim): $(tail -n 1 "$L/$name.log")"
  return $rc
}

step tests 150 python3 -m pytest -q -rfEs -p no:cacheprovider -o faulthandler_timeout=60 \
  tests/test_fp8.py -k cuda
grep -E "^(FAILED|ERROR)" "$L/tests.log" | head -20
for tool in memcheck racecheck; do
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 step "$tool" 120 compute-sanitizer --tool $tool \
    --error-exitcode 17 python3 tools/sanitize_cases.py --sm90
  grep -m1 "ERROR SUMMARY\|RACECHECK SUMMARY" "$L/$tool.log"
done
step ab_vchip 150 python3 tools/device/fwd_env_ab.py --dtype fp8 --env FLASHATTN_SM90_FP8_VCHIP=1 \
  --d 64 128 256 --N 512 1024 2048 4096 16384 --causal 0 1 --rounds 5 --calls 6
cat "$L/ab_vchip.log"
step ab_short 60 python3 tools/device/fwd_env_ab.py --dtype fp8 --env FLASHATTN_SM90_FP8_SHORT=1 \
  --d 64 --N 512 1024 2048 --causal 1 --rounds 7 --calls 10
cat "$L/ab_short.log"
tar -czf "$OUT/logs.tgz" -C /tmp "$(basename $L)" 2>/dev/null
echo "== done ($(( $(date +%s) - t0 )) s)"
