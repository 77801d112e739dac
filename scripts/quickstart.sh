#!/usr/bin/env bash
# Sets up, builds and trains the tiny GPT of configs/tiny.yaml on the CPU, starting
# afresh (its run directory runs/tiny is replaced). Extra arguments go to pptrain.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
rm -rf runs/tiny
build/pptrain --config configs/tiny.yaml "$@"
