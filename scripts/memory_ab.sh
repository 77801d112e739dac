#!/bin/bash
# The memory plan of configs/gpt-1b.yaml on a GPU (bf16) in a few layouts, from two
# pptrain binaries (before and after a change): peak GiB, state bytes per parameter and
# activations GiB of the heaviest rank, as check-config predicts them.
# Usage: scripts/memory_ab.sh OLD_PPTRAIN NEW_PPTRAIN (from the repository root)
set -euo pipefail
OLD=$1
NEW=$2
# The layouts below are given whole: the config without its parallel.layout: auto, which
# a binary from before that key would refuse.
config=$(mktemp --suffix=.yaml)
trap 'rm -f "$config"' EXIT
grep -v '^  layout: auto' configs/gpt-1b.yaml >"$config"
predict() {
  local binary=$1
  shift
  "$binary" check-config --json --config "$config" --set device=cuda "$@" |
    python3 -c "import json, sys; d = json.load(sys.stdin); m = d['memory_mib']
print(f\"{d['predicted_peak_memory_mib'] / 1024:.2f}, {d['state_bytes_per_parameter']:.2f}, {m['activations'] / 1024:.2f}\")"
}
row() {
  local name=$1
  shift
  echo "| $name | $(predict "$OLD" "$@") | $(predict "$NEW" "$@") |"
}
PP4=(--set parallel.pp=4 --set parallel.micro_batches=8)
FULL=(--set train.recompute=full)
echo "| layout | before: peak, B/param, act. | after: peak, B/param, act. |"
echo "|---|---|---|"
row "dp2 ZeRO-1" --set parallel.dp=2 --set parallel.zero=1 --set parallel.micro_batches=4
row "dp8 ZeRO-1" --set parallel.dp=8 --set parallel.zero=1 --set parallel.micro_batches=1
row "tp2 pp2 dp2 ZeRO-1, 1f1b m 8" --set parallel.tp=2 --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.zero=1 --set parallel.micro_batches=8
row "pp4 1f1b, m 8" "${PP4[@]}"
row "pp4 interleaved v2, m 8" "${PP4[@]}" --set parallel.schedule=interleaved --set parallel.virtual_stages=2
row "pp4 zb-v, m 8" "${PP4[@]}" --set parallel.schedule=zb-v --set parallel.virtual_stages=2
row "pp4 1f1b, m 8, full recompute" "${PP4[@]}" "${FULL[@]}"
row "pp4 interleaved v3, m 8, full recompute" "${PP4[@]}" "${FULL[@]}" \
  --set parallel.schedule=interleaved --set parallel.virtual_stages=3
row "pp4 zb-v, m 8, full recompute" "${PP4[@]}" "${FULL[@]}" --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2
