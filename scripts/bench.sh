#!/usr/bin/env bash
# CPU training throughput of pptrain: tokens/s, model GFLOP/s and their share of the
# sgemm ceiling measured in the same run, launch-to-first-step time, and PyTorch's
# tokens/s for the same models when a Python with PyTorch is found (scripts/bench.py).
# Needs a built build/pptrain and build/pptrain-sgemm.
# Usage: scripts/bench.sh [threads (default: all cores)] [steps (default 4)] [rounds (default 1)]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/bench.py --threads "${1:-$(nproc)}" --steps "${2:-4}" --rounds "${3:-1}"
