#!/usr/bin/env bash
# One call on the H200 (the device tool): build, GPU tests, sanitizer, benchmark; a short
# table last. Stages (env STAGES, default "abi build test sanitize bench"):
#   abi      : CPU tests with a build carried from a GPU-less machine (stable-ABI proof)
#   build    : full build here with the machine's own environment (its preset
#              TORCH_CUDA_ARCH_LIST, as a user's pip install gets it; BUILD_ARCHS overrides),
#              timed; the build config, source count and .so size
#   buildtime: the default all-arch build in a copy, timed, beside test + sanitize
#   test     : the CUDA tests (FLASHATTN_REQUIRE_CUDA=1: a skip for want of a kernel fails),
#              once by default choice, then under FLASHATTN_FORCE_BACKEND=sm90 and =sm80
#   sanitize : compute-sanitizer memcheck + racecheck over tools/sanitize_cases.py, synccheck
#              over its sm90 cases
#   ptx80    : a copy built for sm_80 only (+ compute_80 PTX, JIT-compiled here), CUDA tests:
#              the sm_80 code paths (A100, and what sm_86 / sm_89 run) on this GPU
#   bench    : benchmarks/bench_attn.py -> $OUT/h200.json + h200.md (with FA4 when its bundle
#              is here: ../shared/peers/README.md; run 1 stashes .peers/a, run 2 brings .peers/b)
# Extra arguments: ABI_ARGS (pytest, abi stage), TEST_ARGS (pytest, test stage; default
# "-k cuda": the CPU cases already ran in the abi stage), BENCH_ARGS (the benchmark).
# With a carried build and no "build" stage, the carried build is the one tested.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
STAGES="${STAGES:-abi build test sanitize bench}"
PY=python3
summary=()
has() { [[ " $STAGES " == *" $1 "* ]]; }
note() { summary+=("$1"); echo "== $1"; }

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader || true
echo "machine TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>}"
if [ -f .peers/a/part_aa ]; then mkdir -p /tmp/fa4 && cp .peers/a/part_aa /tmp/fa4/ && echo "fa4: half a stashed"; fi
$PY -c "import torch,sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
XDIST=""; $PY -c "import xdist" 2>/dev/null && XDIST="-n ${XDIST_WORKERS:-8}"

if has abi; then
  if [ -f flashattn/_C.abi3.so ]; then
    t0=$(date +%s)
    CUDA_VISIBLE_DEVICES= PYTHONPATH=$PWD $PY -m pytest -q -p no:cacheprovider tests \
      $XDIST ${ABI_ARGS:-} > "$OUT/abi_cpu_tests.log" 2>&1
    rc=$?
    note "abi: carried build, CPU tests rc=$rc: $(tail -n 1 "$OUT/abi_cpu_tests.log") ($(( $(date +%s) - t0 )) s)"
  else
    note "abi: no carried flashattn/_C.abi3.so, skipped"
  fi
fi

if has build; then
  t0=$(date +%s)
  export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MAX_JOBS="${MAX_JOBS:-16}"
  if [ -n "${BUILD_ARCHS:-}" ]; then export TORCH_CUDA_ARCH_LIST="$BUILD_ARCHS"; fi
  rm -f flashattn/_C*.so
  $PY -m pip install --no-build-isolation --no-deps -v -e . > "$OUT/build.log" 2>&1
  rc=$?
  note "build: rc=$rc in $(( $(date +%s) - t0 )) s (TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST-<unset>}, $MAX_JOBS jobs)"
  if [ $rc -ne 0 ]; then grep -E "error" "$OUT/build.log" | head -40; tail -n 30 "$OUT/build.log"; fi
  note "build: $(grep -m1 -oE 'archs .*sources \([0-9]+ sm90\)' "$OUT/build.log"); $(du -m flashattn/_C.abi3.so 2>/dev/null | cut -f1) MB"
  PYTHONPATH=$PWD $PY -c "import flashattn; print('BUILD_CONFIG', flashattn.BUILD_CONFIG)" 2>&1 | tail -n 1
fi

# buildtime: the full default build (every arch family, no TORCH_CUDA_ARCH_LIST) in a copy
# of the tree, in the background while the carried build is tested: an upper bound on the
# uncontended build time, and the carried build stays the one tested and benchmarked.
bt_pid=""
if has buildtime; then
  rm -rf /tmp/bt && mkdir -p /tmp/bt && cp -r csrc flashattn tools setup.py pyproject.toml README.md /tmp/bt/ 2>/dev/null
  rm -f /tmp/bt/flashattn/_C*.so /tmp/bt/flashattn/_build_config.py
  ( cd /tmp/bt && export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MAX_JOBS=16 && unset TORCH_CUDA_ARCH_LIST &&
    t0=$(date +%s) && $PY setup.py build_ext --inplace > "$OUT/buildtime.log" 2>&1;
    echo "rc=$? seconds=$(( $(date +%s) - t0 ))" > /tmp/bt/done ) &
  bt_pid=$!
fi

if has test; then
  for force in ${TEST_FORCE:-auto sm90 sm80}; do
    t0=$(date +%s)
    FLASHATTN_FORCE_BACKEND=$force FLASHATTN_REQUIRE_CUDA=1 PYTHONPATH=$PWD \
      $PY -m pytest -q -rs -p no:cacheprovider tests $XDIST ${TEST_ARGS:--k cuda} \
      > "$OUT/tests_$force.log" 2>&1
    rc=$?
    grep -E "^(FAILED|ERROR)" "$OUT/tests_$force.log" | head -30
    note "test (FLASHATTN_FORCE_BACKEND=$force): rc=$rc: $(tail -n 1 "$OUT/tests_$force.log") ($(( $(date +%s) - t0 )) s)"
  done
  # The skip reasons of the forced-sm90 run, counted: what sm90 does not take yet.
  grep -E "^SKIPPED" "$OUT/tests_sm90.log" 2>/dev/null | sed -E 's/.*(does not take this call: [^(]*).*/\1/' \
    | sort | uniq -c | sort -rn | head -12
fi

if has sanitize; then
  for tool in memcheck racecheck synccheck; do
    t0=$(date +%s)
    cases=""; [ $tool = synccheck ] && cases="--sm90"
    # No caching allocator: each tensor its own cudaMalloc, so memcheck sees the edges of
    # every buffer (pooled 2 MiB blocks would hide an overrun into a neighbouring tensor).
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$PWD \
      compute-sanitizer --tool $tool --error-exitcode 17 $PY tools/sanitize_cases.py $cases \
      > "$OUT/sanitize_$tool.log" 2>&1
    rc=$?
    note "sanitize $tool: rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize_$tool.log" | tail -n 1) ($(( $(date +%s) - t0 )) s)"
  done
fi

if [ -n "$bt_pid" ]; then
  wait $bt_pid
  n_obj=$(find /tmp/bt/build -name "*.o" 2>/dev/null | wc -l)
  note "buildtime: full default build (16 jobs, beside the test stages): $(cat /tmp/bt/done) ($n_obj objects)"
  grep -E "error" "$OUT/buildtime.log" | head -20
fi

if has ptx80; then
  t0=$(date +%s)
  rm -rf /tmp/p80 && mkdir -p /tmp/p80 &&
    cp -r csrc flashattn tools tests setup.py pyproject.toml README.md /tmp/p80/ 2>/dev/null
  rm -f /tmp/p80/flashattn/_C*.so /tmp/p80/flashattn/_build_config.py
  ( cd /tmp/p80 && export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MAX_JOBS=16 \
      TORCH_CUDA_ARCH_LIST=8.0 && $PY setup.py build_ext --inplace > "$OUT/ptx80_build.log" 2>&1 )
  rc=$?
  if [ $rc -eq 0 ]; then
    ( cd /tmp/p80 && export CUDA_CACHE_MAXSIZE=4294967296 && PYTHONPATH=/tmp/p80 $PY -m pytest -q -p no:cacheprovider tests $XDIST \
        -k "${PTX80_ARGS:-cuda}" > "$OUT/ptx80_tests.log" 2>&1 )
    rc=$?
    grep -E "^(FAILED|ERROR)" "$OUT/ptx80_tests.log" | head -20
  fi
  note "ptx80: rc=$rc: $(tail -n 1 "$OUT/ptx80_tests.log" 2>/dev/null) ($(( $(date +%s) - t0 )) s)"
fi

if has bench; then
  t0=$(date +%s)
  if [ -f .peers/b/env.sh ]; then source .peers/b/env.sh; fi
  PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} $PY benchmarks/bench_attn.py --json "$OUT/h200.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  rc=$?
  $PY benchmarks/make_table.py "$OUT/h200.json" > "$OUT/h200.md" 2>> "$OUT/bench.log"
  note "bench: rc=$rc ($(( $(date +%s) - t0 )) s)"
  tail -n 40 "$OUT/h200.md"
fi

echo; echo "==== summary"; printf '%s\n' "${summary[@]}"
