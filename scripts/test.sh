#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (GoogleTest suites and CLI smoke
# tests, through ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j"$(nproc)"
