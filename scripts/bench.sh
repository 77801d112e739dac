#!/usr/bin/env bash
# CPU training throughput of pptrain: a small config and a GPT-2-124M-shaped one.
# Prints one table row per model: tokens/s and TFLOP/s, the median over the timed
# steps (the first step is warm-up and not counted). Needs a built build/pptrain.
# Usage: scripts/bench.sh [threads (default: all cores)] [steps (default 4)]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-$(nproc)}
steps=${2:-4}
bin=build/pptrain
[ -x "$bin" ] || { echo "build first: scripts/setup.sh" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name config overrides...
run() {
  local name=$1 config=$2
  shift 2
  "$bin" --config "$config" --set train.steps="$steps" --set train.threads="$threads" \
    --set train.eval_every=0 --set checkpoint.dir= --set logging.every=1 \
    --set logging.metrics="$work/$name.jsonl" --set logging.level=warn "$@"
  python3 - "$work/$name.jsonl" "$name" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][1:]
tok = statistics.median(r["tokens_per_s"] for r in rows)
tf = statistics.median(r["tflops_per_rank"] for r in rows)
print(f"| {sys.argv[2]:<22} | {tok:>12,.0f} | {tf * 1000:>10.1f} |")
PY
}

echo "pptrain CPU benchmark: $(nproc) cores, $threads thread(s), $steps steps each, $(date -u +%F)"
echo "| model                  |     tokens/s |   GFLOP/s |"
echo "|------------------------|--------------|-----------|"
run "tiny (2L, d64, T64)" configs/tiny.yaml
run "small (6L, d256, T256)" configs/tiny.yaml --set model.n_layer=6 --set model.d_model=256 \
  --set model.n_head=8 --set model.seq_len=256 --set parallel.micro_batches=1 \
  --set parallel.micro_batch_size=4
run "GPT-2 124M (T1024)" configs/gpt2-124m.yaml --set parallel.micro_batches=1 \
  --set parallel.micro_batch_size=1
