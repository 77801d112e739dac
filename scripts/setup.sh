#!/usr/bin/env bash
# Installs what pptrain needs (Debian 12 packages, only those missing) and builds it
# into ./build (Release). Usage: scripts/setup.sh [extra cmake args]
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config libyaml-cpp-dev libcli11-dev
          libspdlog-dev libopenblas-dev nlohmann-json3-dev libgtest-dev
          openmpi-bin libopenmpi-dev)
scripts/install_packages.sh "${packages[@]}"

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build build -j"$(nproc)"
