#!/usr/bin/env bash
# One call (2026-12-07, sixth session): the deterministic backward's switches
# (FLASHATTN_SM90_DET_DIAG / _DQ2; opt-in then, the default since this call's run in the eighth
# session; their tests set them either way), which hung once on an H100, tested one group at a
# time under a time limit, then `tests -k cuda`. Beside the package's build (the machine's own
# environment), a debugging build in a copy (-DFLASHATTN_SM90_DET_DEBUG=1: the semaphore waits
# give up after 2 s, print where they were and go on, so a hang becomes a failing test with a
# place; it bounds the semaphore waits, not a named barrier's); a group that times out on the
# package's build runs again on it. If every group passed, det_order_ab.py times the switches
# (DET_AB=0: not). Everything within DEADLINE seconds
# (default 570); logs in $OUT/logs.tgz, a summary last.
set -uo pipefail
export PYTHONUNBUFFERED=1 PATH=/usr/local/cuda/bin:$PATH CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT="${OUT:-/tmp/out}"; L=/tmp/logs; mkdir -p "$OUT" $L
if [ -f .peers/a/part_aa ]; then mkdir -p /tmp/fa4 && cp .peers/a/part_aa /tmp/fa4/; fi
t0=$(date +%s); DEADLINE=${DEADLINE:-570}
left() { echo $(( DEADLINE - ($(date +%s) - t0) )); }
ROOT=$PWD D=/tmp/dbg
# The summary also goes to $OUT as it is written (a call cut short by the budget keeps it).
exec > >(tee "$OUT/summary.txt") 2>&1
SHORT=(FLASHATTN_HEADDIMS=64,128,256 FLASHATTN_DISABLE_DROPOUT=1 FLASHATTN_DISABLE_BLOCK_SPARSE=1
       FLASHATTN_DISABLE_FP8=1)
dbg=""
if [ "${LEAN:-0}" != 1 ]; then
  rm -rf $D && mkdir -p $D
  git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C $D
  ( cd $D && env NVCC_APPEND_FLAGS="-DFLASHATTN_SM90_DET_DEBUG=1" "${SHORT[@]}" \
      MAX_JOBS=${DBG_JOBS:-5} python3 setup.py build_ext --inplace > $L/build_dbg.log 2>&1
    echo "== debug build rc=$? ($(( $(date +%s) - t0 )) s)" ) > $L/dbg_rc.txt 2>&1 &
  dbg=$!
fi
rm -f flashattn/_C*.so
# LEAN=1 (a call on a little budget): no debugging build, and the package built for the
# switches' tests alone (head dims 64 / 128 / 256, no dropout, block-sparse or FP8 kernels).
lean=(); [ "${LEAN:-0}" = 1 ] && lean=("${SHORT[@]}")
env "${lean[@]}" MAX_JOBS=${MAX_JOBS:-11} python3 -m pip install --no-build-isolation --no-deps -v \
  -e . > $L/build.log 2>&1
echo "== build rc=$? ($(( $(date +%s) - t0 )) s, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>}${lean:+, lean: ${lean[*]}})"
grep -m1 -oE 'archs .*sources \([0-9]+ sm90\)' $L/build.log
grep -E " error|error:" $L/build.log | head -10

det_group() {  # name, tree, -k expression, limit (s)
  local lim=$4
  [ "$lim" -gt "$(left)" ] && lim=$(left)
  if [ "$lim" -lt 20 ]; then echo "== det $1: no time left"; return 99; fi
  PYTHONPATH=$2 timeout -s INT -k 10 $lim \
    bash -c "cd $2 && exec python3 -m pytest -x -v -p no:cacheprovider -o faulthandler_timeout=30 \
      tests/test_cuda.py -k '$3'" > $L/det_$1.log 2>&1
  local rc=$?
  local pkg
  pkg=$(cd /tmp && PYTHONPATH=$2 python3 -c 'import flashattn; print(flashattn.__file__)' 2>&1 | tail -n 1)
  echo "== det $1 ($3, $pkg) rc=$rc: $(tail -n 1 $L/det_$1.log)"
  grep -E "(PASSED|FAILED|SKIPPED|ERROR)( |$)" $L/det_$1.log | sed 's/^tests.test_cuda.py:://' | tail -n 30
  grep -E "turn not reached|Timeout|^E  " $L/det_$1.log | sort | uniq -c | sort -rn | head -20
  return $rc
}
hung=(); clean=1
for g in "dq2:sm90 and dq2 and not diag" "diag:diag and not dq2" "diag_dq2:diag and dq2"; do
  name=${g%%:*}; expr=${g#*:}
  det_group $name $ROOT "$expr" ${GROUP_LIMIT:-75}
  rc=$?
  [ $rc = 0 ] || clean=0
  [ $rc = 124 ] || [ $rc = 130 ] || [ $rc = 137 ] && hung+=("$g")
done
[ -n "$dbg" ] && { wait $dbg; cat $L/dbg_rc.txt; grep -E " error|error:" $L/build_dbg.log | head -5; }
[ -n "$dbg" ] && for g in "${hung[@]}"; do
  name=${g%%:*}; expr=${g#*:}
  det_group dbg_$name $D "$expr" ${DBG_LIMIT:-90}
done

# Every group passed: the switches timed against the default and the index order, in one
# process.
if [ $clean = 1 ] && [ "${DET_AB:-1}" = 1 ]; then
  lim=${AB_LIMIT:-150}; [ $lim -gt $(( $(left) - 60 )) ] && lim=$(( $(left) - 60 ))
  if [ $lim -gt 30 ]; then
    PYTHONPATH=$ROOT timeout $lim python3 tools/device/det_order_ab.py ${AB_ARGS:---d 64 128 256 \
      --N 1024 4096 16384 --rounds 5 --calls 4} 2>&1 | tee $L/det_order_ab.txt
    echo "== det A/B rc=${PIPESTATUS[0]} (limit $lim s)"
  fi
fi
lim=$(( $(left) - 15 ))
if [ $lim -gt 40 ] && [ "${LEAN:-0}" != 1 ]; then
  t1=$(date +%s)
  FLASHATTN_REQUIRE_CUDA=1 PYTHONPATH=$PWD timeout -s INT -k 15 $lim bash -c "exec python3 -m pytest \
    -q -rfEs -p no:cacheprovider -o faulthandler_timeout=60 -n 8 tests -k cuda" > $L/tests_cuda.log 2>&1
  echo "== tests cuda rc=$? (limit $lim s): $(tail -n 1 $L/tests_cuda.log) ($(( $(date +%s) - t1 )) s)"
  grep -E "^(FAILED|ERROR)" $L/tests_cuda.log | head -20
  grep -E "Timeout|^E  " $L/tests_cuda.log | head -20
else
  echo "== tests cuda: no time left ($lim s)"
fi
tar -czf "$OUT/logs.tgz" -C /tmp logs 2>/dev/null
echo "== done ($(( $(date +%s) - t0 )) s)"
