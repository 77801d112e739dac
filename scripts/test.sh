#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (GoogleTest suites, CLI smoke tests
# and the Hugging Face reference check, through ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Hugging Face reference test needs numpy and safetensors, the plot test matplotlib;
# without them those tests are skipped.
if ! python3 -c "import numpy, safetensors.numpy, matplotlib" 2>/dev/null; then
  python3 -m pip install --quiet numpy safetensors matplotlib 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages numpy safetensors matplotlib 2>/dev/null ||
    echo "numpy/safetensors/matplotlib unavailable: the tests that need them will be skipped"
fi
scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
