#!/bin/bash
# A ZeRO-1 run that saves a checkpoint after every step, from two pptrain binaries
# (before and after a change): 4 data-parallel CPU ranks, a 38M-parameter model (4
# layers, d_model 512, GPT-2's vocabulary), 3 steps. Prints, per binary, the wall time,
# the most any rank held (peak_rss_mib of the last step) and the step dir's tensor files.
# Usage: scripts/zero_checkpoint_ab.sh OLD_PPTRAIN NEW_PPTRAIN (from the repository root)
set -euo pipefail
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The config without parallel.layout, which a binary from before that key would refuse.
grep -v '^  layout:' configs/tiny.yaml >"$work/config.yaml"
run() {
  local name=$1 binary=$2
  local start end
  start=$(date +%s.%N)
  "$binary" --config "$work/config.yaml" --set model.n_layer=4 --set model.n_head=8 \
    --set model.d_model=512 --set model.seq_len=64 --set model.vocab_size=50257 \
    --set parallel.dp=4 --set parallel.zero=1 --set parallel.micro_batches=1 \
    --set parallel.micro_batch_size=2 --set train.steps=3 --set train.eval_every=0 \
    --set train.threads=1 --set checkpoint.every=1 --set checkpoint.keep=1 \
    --set "checkpoint.dir=$work/$name" --set "logging.metrics=$work/$name.jsonl" >/dev/null 2>&1
  end=$(date +%s.%N)
  python3 - "$work/$name.jsonl" "$work/$name" "$name" "$start" "$end" <<'PY'
import json, os, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
step = os.path.join(sys.argv[2], open(os.path.join(sys.argv[2], "latest")).read().strip())
files = sorted(f for f in os.listdir(step) if f.endswith(".safetensors"))
mib = sum(os.path.getsize(os.path.join(step, f)) for f in files) / 2**20
print(f"{sys.argv[3]}: {float(sys.argv[5]) - float(sys.argv[4]):.1f} s, peak_rss_mib "
      f"{rows[-1]['peak_rss_mib']:.0f}, {len(files)} tensor files, {mib:.0f} MiB: {' '.join(files)}")
PY
}
run before "$1"
run after "$2"
