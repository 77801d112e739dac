#!/usr/bin/env bash
# Trains a tiny GPT on a text file, then checks its validation loss against
# scripts/hf_reference.py, an independent float64 GPT-2 forward pass over the same
# windows of the checkpoint's model.safetensors. Compared: the loss `pptrain eval` prints
# for the checkpoint (rounded as printed) and the trainer's full-precision final
# validation loss from its metrics file.
#   run_reference.sh PPTRAIN PYTHON SOURCE_DIR WORK_DIR RTOL [--set KEY=VALUE ...]
set -euo pipefail
pptrain=$1 python=$2 src=$3 work=$4 rtol=$5
shift 5
rm -rf "$work"
mkdir -p "$work"
data=$src/docs/config.md
n_head=4
args=(--config "$src/configs/tiny.yaml"
      --set data.source=text --set "data.path=$data" --set "data.val_path=$data"
      --set model.n_layer=2 --set "model.n_head=$n_head" --set model.d_model=64
      --set model.seq_len=32 --set model.vocab_size=256
      --set parallel.micro_batches=1 --set parallel.micro_batch_size=4
      --set train.steps=200 --set train.warmup_steps=10 --set train.eval_every=0
      --set train.eval_batches=0 --set train.threads=1
      --set "checkpoint.dir=$work/ckpt" --set checkpoint.every=0
      --set logging.every=100 --set "logging.metrics=$work/metrics.jsonl" --set logging.trace=
      "$@")
"$pptrain" "${args[@]}"
out=$("$pptrain" eval "${args[@]}" --set checkpoint.resume=auto)
echo "$out"
eval_loss=$(sed -n 's/^val_loss \([0-9.eE+-]*\)$/\1/p' <<<"$out")
train_loss=$(sed -n 's/.*"val_loss":\([0-9.eE+-]*\).*/\1/p' "$work/metrics.jsonl" | tail -n 1)
if [[ -z $eval_loss || -z $train_loss ]]; then
  echo "error: no val_loss from pptrain eval ('$eval_loss') or its metrics ('$train_loss')" >&2
  exit 1
fi
step_dir=$(find "$work/ckpt" -mindepth 1 -maxdepth 1 -type d -name 'step_*' | sort | tail -n 1)
exec "$python" "$src/scripts/hf_reference.py" "$step_dir" --n-head "$n_head" \
  --data "$data" --format text --compare "$eval_loss" --compare "$train_loss" --rtol "$rtol"
