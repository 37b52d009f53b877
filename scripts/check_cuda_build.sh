#!/usr/bin/env bash
# Checks that Concord compiles with the CUDA backend on a machine without a GPU, and with
# --build links the binary that scripts/gpu_check.sh runs on a GPU machine
# (target/gpu/concord).
#
# A CUDA toolkit is installed from PyPI's nvidia-* wheels into .cuda/ (ignored by git):
# nvcc compiles candle's kernels to PTX at build time, the runtime/cccl/cublas/curand
# wheels supply the headers and the libraries to link against. CUDA_COMPUTE_CAP stands
# in for the GPU nvcc cannot query.
#
# CUDA_VERSION (default 13.0) must not be newer than what the GPU machine's driver
# supports: candle loads its kernels as PTX, and a driver refuses PTX from a newer
# toolkit. The GPU machines lent to this project run driver 580 (CUDA 13.0).
# Usage: scripts/check_cuda_build.sh [--build]   (--build also links the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
CUDA_VERSION="${CUDA_VERSION:-13.0}"
CUDA_MAJOR="${CUDA_VERSION%%.*}"
ROOT="$PWD/.cuda/$CUDA_VERSION"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"

if [ ! -x "$ROOT/py/nvidia/cu$CUDA_MAJOR/bin/nvcc" ]; then
  echo "installing a CUDA $CUDA_VERSION toolkit from PyPI into $ROOT/py ..."
  "$PY" -m pip install --quiet --disable-pip-version-check --target "$ROOT/py" \
    "nvidia-cuda-nvcc==$CUDA_VERSION.*" "nvidia-cuda-runtime==$CUDA_VERSION.*" \
    "nvidia-cuda-cccl==$CUDA_VERSION.*" "nvidia-cublas==$CUDA_VERSION.*" \
    "nvidia-curand" "nvidia-cuda-nvrtc==$CUDA_VERSION.*" \
    "nvidia-nvvm==$CUDA_VERSION.*" "nvidia-cuda-crt==$CUDA_VERSION.*"
fi
CUDA_HOME="$ROOT/py/nvidia/cu$CUDA_MAJOR"
# The wheels ship versioned shared objects only; linkers look for the bare names.
for lib in "$CUDA_HOME"/lib/lib*.so.*; do
  [ -e "$lib" ] || continue
  bare="${lib%%.so.*}.so"
  [ -e "$bare" ] || ln -s "$(basename "$lib")" "$bare"
done
export CUDA_HOME CUDA_PATH="$CUDA_HOME" CUDA_ROOT="$CUDA_HOME"
export PATH="$CUDA_HOME/bin:$PATH"
export LIBRARY_PATH="$ROOT/stubs:$CUDA_HOME/lib:${LIBRARY_PATH:-}"
export CPATH="$CUDA_HOME/include:${CPATH:-}"
nvcc --version | tail -2
echo "CUDA_COMPUTE_CAP=$CUDA_COMPUTE_CAP"
# cudarc 0.19 knows CUDA releases up to 13.4 and refuses newer nvcc versions; the 13.x
# driver API is stable across minor releases, so newer 13.x toolkits use 13.4 bindings.
nvcc_version="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p')"
read -r major minor <<<"$nvcc_version"
if [ "$major" = 13 ] && [ "$minor" -gt 4 ]; then minor=4; fi
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-${major}0${minor}0}"
echo "CUDARC_CUDA_VERSION=$CUDARC_CUDA_VERSION"

# A target dir per toolkit keeps the CPU build cache untouched and never mixes kernels
# compiled by two nvcc versions.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/cuda-$CUDA_VERSION}"
# nccl rides along in the check: cudarc's NCCL bindings are pregenerated, so checking
# needs no NCCL. The --build below stays without it: candle builds cudarc with
# `dynamic-linking`, which links -lnccl, and no NCCL is installed here.
cargo check --release --features cuda,nccl --all-targets
echo "cargo check --features cuda,nccl: OK"
if [ "${1:-}" = "--build" ]; then
  # candle links the driver library (libcuda.so.1), which comes with the GPU driver, not
  # with a toolkit wheel. Link against a stub with the same soname that defines every
  # driver entry point the crates call; at run time the real driver is loaded instead.
  cargo build --release --features cuda --lib
  mkdir -p "$ROOT/stubs"
  nm -u --format=just-symbols "$CARGO_TARGET_DIR"/release/deps/*.rlib 2>/dev/null \
    | grep -E '^cu[A-Z]' | sort -u \
    | sed 's/.*/int &(void) { return 999; }/' > "$ROOT/stubs/libcuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$ROOT/stubs/libcuda.so" "$ROOT/stubs/libcuda_stub.c"
  echo "driver stub: $(wc -l < "$ROOT/stubs/libcuda_stub.c") entry points"
  cargo build --release --features cuda
  # Stripped and gzip'd for the trip to a GPU machine (the PTX of candle's kernels makes
  # the binary ~70 MB, more than a device call carries; gzip'd it is ~20 MB).
  mkdir -p target/gpu
  cp "$CARGO_TARGET_DIR/release/concord" target/gpu/concord
  strip target/gpu/concord
  gzip -9 -c target/gpu/concord > target/gpu/concord.gz
  echo "cargo build --features cuda: OK (target/gpu/concord and target/gpu/concord.gz, what gpu_check.sh runs)"
fi
