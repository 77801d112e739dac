#!/usr/bin/env bash
# Installs what pptrain needs (Debian 12 packages, only those missing) and builds it
# into ./build (Release), with the CUDA backend when the CUDA toolkit is installed (for
# sm_80 and sm_90a; pass -DCMAKE_CUDA_ARCHITECTURES=... to change, -DPPTRAIN_CUDA=OFF to
# skip it). Usage: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config libyaml-cpp-dev libcli11-dev
          libspdlog-dev libopenblas-openmp-dev nlohmann-json3-dev libgtest-dev
          openmpi-bin libopenmpi-dev)
scripts/install_packages.sh "${packages[@]}"

# The toolkit's usual home, when its nvcc is not on PATH.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
