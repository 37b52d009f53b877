#!/usr/bin/env bash
# Checks that Concord compiles with the CUDA backend on a machine without a GPU.
#
# A CUDA toolkit is installed from PyPI's nvidia-* wheels into .cuda/ (ignored by git):
# nvcc compiles candle's kernels to PTX at build time, the runtime/cccl/cublas/curand
# wheels supply the headers. CUDA_COMPUTE_CAP stands in for the GPU nvcc cannot query.
# Usage: scripts/check_cuda_build.sh [--build]   (--build also links the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD/.cuda"
PY="${PYTHON:-python3}"
CUDA_MAJOR="${CUDA_MAJOR:-13}"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-80}"

if [ ! -x "$ROOT/py/nvidia/cu$CUDA_MAJOR/bin/nvcc" ]; then
  echo "installing a CUDA $CUDA_MAJOR toolkit from PyPI into $ROOT/py ..."
  "$PY" -m pip install --quiet --disable-pip-version-check --target "$ROOT/py" \
    "nvidia-cuda-nvcc==$CUDA_MAJOR.*" "nvidia-cuda-runtime==$CUDA_MAJOR.*" \
    "nvidia-cuda-cccl==$CUDA_MAJOR.*" "nvidia-cublas==$CUDA_MAJOR.*" \
    "nvidia-curand" "nvidia-cuda-nvrtc==$CUDA_MAJOR.*"
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
export LIBRARY_PATH="$CUDA_HOME/lib:$CUDA_HOME/lib/stubs:${LIBRARY_PATH:-}"
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

# A separate target dir keeps the CPU build cache untouched.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/cuda}"
cargo check --release --features cuda --all-targets
echo "cargo check --features cuda: OK"
if [ "${1:-}" = "--build" ]; then
  cargo build --release --features cuda
  echo "cargo build --features cuda: OK ($CARGO_TARGET_DIR/release/concord)"
fi
