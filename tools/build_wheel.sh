#!/usr/bin/env bash
# tools/build_wheel.sh: the release wheel, built from scratch into dist/. One cp310-abi3 wheel
# (torch's stable ABI + Python's limited API: every torch >= 2.10 built with CUDA 13, every
# Python >= 3.10), then a manylinux tag from auditwheel repair, which leaves out torch's own
# libraries and the CUDA runtime torch brings (its nvidia-cuda-runtime package): nothing is
# grafted in, and the tag is the glibc the build machine links against (manylinux_2_34 on a
# glibc-2.36 machine; torch's own manylinux_2_28 needs a build in a manylinux_2_28 image).
# Run in a venv with torch (the build's) and, for the tag, auditwheel and patchelf on PATH.
# Environment: TORCH_CUDA_ARCH_LIST (default "8.0;9.0a"), MAX_JOBS (default 2), CUDA_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" MAX_JOBS="${MAX_JOBS:-2}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST-8.0;9.0a}"
rm -rf build dist/flashattn-*.whl && mkdir -p dist
t0=$(date +%s)
if ! python -m pip wheel --no-build-isolation --no-deps -v -w dist . > dist/build.log 2>&1; then
  tail -n 40 dist/build.log; echo "build_wheel: build failed (dist/build.log)"; exit 1
fi
grep -m1 -oE "flashattn: CUDA .*" dist/build.log || true
echo "build_wheel: built in $(( $(date +%s) - t0 )) s" \
  "(TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, MAX_JOBS=$MAX_JOBS)"
wheel=$(ls dist/flashattn-*-linux_x86_64.whl)
if command -v auditwheel > /dev/null; then
  auditwheel repair -w dist --exclude 'libc10*.so' --exclude 'libtorch*.so' \
    --exclude 'libcudart.so.*' "$wheel" 2>&1 | grep -E "Excluding|New WHEEL|Fixed-up|rror"
  rm "$wheel"
else
  echo "build_wheel: no auditwheel on PATH: $wheel keeps the linux_x86_64 tag"
fi
for w in dist/flashattn-*.whl; do
  echo "build_wheel: $w $(du -b "$w" | awk '{printf "%.1f MiB", $1 / 1048576}')"
done
