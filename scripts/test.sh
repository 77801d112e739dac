#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (GoogleTest suites, CLI smoke tests
# and the Hugging Face reference check, through ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
# The Hugging Face reference test needs numpy and safetensors; without them it is skipped.
if ! python3 -c "import numpy, safetensors.numpy" 2>/dev/null; then
  python3 -m pip install --quiet numpy safetensors 2>/dev/null ||
    python3 -m pip install --quiet --break-system-packages numpy safetensors 2>/dev/null ||
    echo "numpy/safetensors unavailable: the Hugging Face reference test will be skipped"
fi
scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
