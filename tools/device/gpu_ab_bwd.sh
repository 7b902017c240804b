#!/usr/bin/env bash
# A/B timing of the sm80 backward: the working tree against an older tree in $AB_BASE
# (default ab_base, from `git archive <rev> csrc tools | tar -x -C ab_base`, rev >= c2979e1
# for the self-test's --one), each built with its own self-test (tools/selftest/, or tools/ in
# trees from before that folder), d64 and d128 only (-DSELFTEST_ONLY_64_128) unless
# ALL_DIMS=1, binaries run alternately on the same cells. Carry ab_base.
# TREES="ab_base ab_x ..." compares more trees (each with csrc/ and tools/, carried too);
# PATCHES="x.patch ..." (paths from the repository root, carried) adds one tree per patch
# (the working tree, patched); "x.patch+y.patch" is one tree with both.
# Without ab_base and TREES, only the working tree and the patched copies run.
set -uo pipefail
TREES="${TREES:-${AB_BASE:-ab_base}}"
[ -d "$TREES" ] || [ "$TREES" != ab_base ] || TREES=""
for pf in ${PATCHES:-}; do  # "a.patch+b.patch": one tree with both applied
  name=""; for one in ${pf//+/ }; do name="$name${name:++}$(basename "$one" .patch)"; done
  t=/tmp/abp_$name; rm -rf "$t"; mkdir -p "$t"; cp -r csrc tools "$t"/
  for one in ${pf//+/ }; do
    ( cd "$t" && git apply "$OLDPWD/$one" ) || { echo "patch $one does not apply"; exit 1; }
  done
  TREES="$TREES $t"
done
B=/tmp/ab; mkdir -p $B
# ALL_DIMS=1: every head-dim bucket in each tree (cells with d 32 / 96 / 192 / 256; slower).
DIMS="64 128"; A="-std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -DSELFTEST_ONLY_64_128"
if [ "${ALL_DIMS:-0}" = 1 ]; then DIMS="32 64 96 128 192 256"; A="${A% -D*}"; fi
t0=$(date +%s)
names="new"; for t in $TREES; do names="$names $(basename $t)"; done
for v in $names; do
  src=csrc; st=tools/selftest/selftest_bwd_sm80.cu
  for t in $TREES; do
    [ "$(basename $t)" = $v ] || continue
    src=$t/csrc; st=$t/tools/selftest/selftest_bwd_sm80.cu
    [ -f $st ] || st=$t/tools/selftest_bwd_sm80.cu  # trees from before tools/selftest/
  done
  mkdir -p $B/$v
  for d in $DIMS; do nvcc $A -I $src -c $src/instantiations/bwd_sm80_hdim${d}_bf16.cu -o $B/$v/h$d.o & done
  nvcc $A -I $src -c $st -o $B/$v/st.o &
done
wait
for v in $names; do
  objs=""; for d in $DIMS; do objs="$objs $B/$v/h$d.o"; done
  nvcc $A $B/$v/st.o $objs -o $B/$v/selftest || exit 1
done
echo "== compiled in $(( $(date +%s) - t0 )) s"
for v in $names; do  # correctness: FAIL lines and the summary (or the error) last
  echo "$v: $($B/$v/selftest 2>&1 | grep -E "FAIL|failed|error" | tail -n 5)"
done
CELLS="${CELLS:-64,2048,0 64,2048,1 64,8192,0 64,8192,1 128,2048,0 128,2048,1 128,8192,0 128,8192,1 64,4096,1,1 128,4096,1,1}"
for cell in $CELLS; do
  set -- ${cell//,/ }
  for rep in 1 2; do for v in $names; do
    echo "$v: $($B/$v/selftest --one $1 $2 $3 ${4:-0})"
  done; done
done
if [ "${FULL:-1}" = 1 ]; then  # every head-dim bucket of the working tree: correctness
  A2="-std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -I csrc"
  for d in 32 96 192 256; do nvcc $A2 -c csrc/instantiations/bwd_sm80_hdim${d}_bf16.cu -o $B/new/h$d.o & done
  nvcc $A2 -c csrc/instantiations/bwd_sm80_hdim64_bf16.cu -o $B/new/f64.o &
  nvcc $A2 -c csrc/instantiations/bwd_sm80_hdim128_bf16.cu -o $B/new/f128.o &
  nvcc $A2 -c tools/selftest/selftest_bwd_sm80.cu -o $B/new/stf.o &
  wait
  nvcc $A2 $B/new/stf.o $B/new/f64.o $B/new/f128.o $B/new/h32.o $B/new/h96.o $B/new/h192.o $B/new/h256.o -o $B/new/selftest_full &&
    $B/new/selftest_full --bench d256 | grep -vE " ok$"
fi
