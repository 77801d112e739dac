#!/usr/bin/env python3
"""Kernel launches a training step makes on the emulated GPU.

Runs pptrain-emulated (a build with -DPPTRAIN_EMULATED_GPU=ON) on one emulated GPU twice,
for STEPS and STEPS + 1 steps, with PPTRAIN_EMULATED_LAUNCH_COUNT set so that the
emulator writes each run's launch count as it exits; the difference is one step's
launches (every kernel and cuBLASLt product; copies and memsets are not launches).
The model is the config's with the overrides given; GPT-2 124M's layer count by default.
Usage: emulated_launches.py PPTRAIN_EMULATED CONFIG [KEY=VALUE ...]
"""
import os
import subprocess
import sys
import tempfile

STEPS = 2
DEFAULTS = ["model.n_layer=12", "model.d_model=64", "model.seq_len=64", "device=cuda",
            "train.precision=bf16", "parallel.micro_batches=1", "parallel.micro_batch_size=4",
            "checkpoint.dir=", "train.eval_every=0", "train.eval_batches=1"]


def launches(binary, config, sets, steps, work):
    path = os.path.join(work, f"launches{steps}")
    env = dict(os.environ, PPTRAIN_EMULATED_GPUS="1", PPTRAIN_EMULATED_LAUNCH_COUNT=path)
    argv = [binary, "--config", config]
    for s in DEFAULTS + sets + [f"train.steps={steps}"]:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env)
    if out.returncode != 0:
        sys.exit(f"pptrain-emulated exited {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    with open(path) as f:
        return int(f.readline())


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    binary, config, sets = sys.argv[1], sys.argv[2], sys.argv[3:]
    with tempfile.TemporaryDirectory() as work:
        first = launches(binary, config, sets, STEPS, work)
        second = launches(binary, config, sets, STEPS + 1, work)
    print(f"launches a step: {second - first} ({' '.join(DEFAULTS + sets)})")


if __name__ == "__main__":
    main()
