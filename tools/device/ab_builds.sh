#!/usr/bin/env bash
# One GPU call: A/B of build-time switches (nvcc defines) against the package's default build.
# The package is built in place with the machine's own environment (as a user's pip install);
# each variant in VARIANTS ("name:defines:headdims[:tree]" entries, space-separated; defines
# "+"-joined, e.g. "skip:-DFLASHATTN_SM90_SKIP_RESCALE=1:128,256") in its own copy of the
# tracked tree, or of the folder `tree` (e.g. an older commit's `git archive`, carried)
# (/tmp/ab/<name>, FLASHATTN_HEADDIMS=headdims to keep it short), built at the same time. Then,
# for each build, TEST_ARGS (pytest; default the FP8 CUDA tests; VARIANT_TEST_ARGS, when set, for
# the variants' builds instead) and BENCH_ARGS
# (bench_attn.py; default the FP8 forward at d 128 / 256), the benchmarks in the order base,
# variants, base again (the two base runs bound the drift between processes). Logs and JSON
# under $OUT (at most 8 files come back: keep VARIANTS short); a summary last.
# BUILD=0 skips the in-place build (a warm machine that built it already). SUMMARY_COL: the
# benchmark column the summary compares (default flashattn; e.g. flashattn_drop with --dropout).
set -uo pipefail
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1 CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"; L=/tmp/ab_logs; mkdir -p $L
ROOT=$PWD
VARIANTS="${VARIANTS:-skip:-DFLASHATTN_SM90_SKIP_RESCALE=1:128,256}"
TEST_ARGS="${TEST_ARGS:-tests/test_fp8.py -k cuda}"
BENCH_ARGS="${BENCH_ARGS:---dtype fp8 --d 128 256 --N 1024 4096 16384 --causal 0 1}"
t0=$(date +%s)
pids=()
for v in $VARIANTS; do
  IFS=: read -r name defs hdims src <<< "$v"
  rm -rf /tmp/ab/$name && mkdir -p /tmp/ab/$name
  if [ -n "$src" ]; then  # another tree (e.g. an older commit's, carried): its files
    cp -r "$src"/. /tmp/ab/$name/
  else
    # the tree as carried (new files may be missing from a copied index: --others too)
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - \
      | tar -xf - -C /tmp/ab/$name
  fi
  ( cd /tmp/ab/$name && NVCC_APPEND_FLAGS="${defs//+/ } ${NVCC_APPEND_FLAGS:-}" \
      FLASHATTN_HEADDIMS="$hdims" MAX_JOBS=${AB_JOBS:-6} python3 setup.py build_ext --inplace \
      > $L/build_$name.log 2>&1; echo "== build $name rc=$? ($(( $(date +%s) - t0 )) s)" ) &
  pids+=($!)
done
if [ "${BUILD:-1}" = 1 ]; then
  rm -f flashattn/_C*.so
  MAX_JOBS=${MAX_JOBS:-16} python3 -m pip install --no-build-isolation --no-deps -v -e . \
    > $L/build_base.log 2>&1
  echo "== build base rc=$? ($(( $(date +%s) - t0 )) s, TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>})"
fi
for p in "${pids[@]}"; do wait $p; done
for v in $VARIANTS; do
  IFS=: read -r name _ _ <<< "$v"
  grep -E "spill stores" $L/build_$name.log | grep -v " 0 bytes spill" | sort | uniq -c | head -5
done
run_tests() {  # name, tree, require (0 for a variant narrowed by FLASHATTN_HEADDIMS: the cases
  # of the head dims it left out skip, and the summary line counts them), pytest arguments
  FLASHATTN_REQUIRE_CUDA=${3:-1} PYTHONPATH=$2 timeout -s INT -k 10 ${TEST_LIMIT:-120} \
    bash -c "cd $2 && exec python3 -m pytest -q -rfE -p no:cacheprovider -n 8 ${4:-$TEST_ARGS}" \
    > $L/tests_$1.log 2>&1
  echo "== tests $1 rc=$?: $(tail -n 1 $L/tests_$1.log) ($(cd /tmp && PYTHONPATH=$2 python3 -c \
    'import flashattn; print(flashattn.__file__)' 2>&1 | tail -n 1))"
  grep -E "^(FAILED|ERROR)" $L/tests_$1.log | head -10
}
run_bench() {  # name, tree, json
  PYTHONPATH=$2 timeout ${BENCH_LIMIT:-150} python3 $ROOT/benchmarks/bench_attn.py $BENCH_ARGS \
    --json "$3" > $L/bench_$(basename "$3" .json).log 2>&1
  echo "== bench $1 rc=$?"
}
run_tests base "$ROOT"
if [ "${TEST_VARIANTS:-1}" = 1 ]; then  # 0: the base build's tests only
  for v in $VARIANTS; do
    IFS=: read -r name _ hdims _ <<< "$v"
    run_tests $name /tmp/ab/$name $([ -n "$hdims" ] && echo 0 || echo 1) \
      "${VARIANT_TEST_ARGS:-$TEST_ARGS}"
  done
fi
run_bench base "$ROOT" "$OUT/ab_base.json"
for v in $VARIANTS; do
  IFS=: read -r name _ _ <<< "$v"; run_bench $name /tmp/ab/$name "$OUT/ab_$name.json"
done
run_bench base "$ROOT" "$OUT/ab_base2.json"
tar czf "$OUT/ab_logs.tgz" -C $L .
# Summary: each cell's TFLOP/s of our (first) column per build, and the variants over the base
# runs' mean.
python3 - "$OUT" $VARIANTS <<'EOF'
import json, os, sys
out, names = sys.argv[1], ["base"] + [v.split(":")[0] for v in sys.argv[2:]] + ["base2"]
col = os.environ.get("SUMMARY_COL", "flashattn")  # the bench column compared
runs = {}
for n in names:
    path = os.path.join(out, f"ab_{n}.json")
    if os.path.exists(path):
        runs[n] = {(r["mode"], r["d"], r["causal"], r["N"]): r.get(col)
                   for r in json.load(open(path))["rows"]}
print("cell".ljust(24) + "".join(n.rjust(10) for n in runs) + "  variant / mean(base, base2)")
for cell in runs.get("base", {}):
    vals = {n: runs[n].get(cell) for n in runs}
    bases = [vals[b] for b in ("base", "base2") if vals.get(b)]
    mean = sum(bases) / len(bases) if bases else None
    ratios = [f"{n} {vals[n] / mean:.3f}" for n in runs if n not in ("base", "base2")
              and vals.get(n) and mean]
    print(str(cell).ljust(24) + "".join(
        (f"{vals[n]:.1f}" if vals[n] else "-").rjust(10) for n in runs) + "  " + ", ".join(ratios))
EOF
echo "== total $(( $(date +%s) - t0 )) s"
