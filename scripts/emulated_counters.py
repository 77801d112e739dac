#!/usr/bin/env python3
"""What a training step's kernels do on the emulated GPU, per step and per layer.

Runs pptrain-emulated (a build with -DPPTRAIN_EMULATED_GPU=ON) on one emulated GPU for
STEPS steps, at the config's layer count L (12, GPT-2 124M's, by default) and at L + 1,
and reads the last step's counters from the metrics (kernel_launches, global_bytes,
shared_bytes, mma_ops: every kernel and cuBLASLt product, as the emulator counts them,
tests/ops/emulation/emulator_counters.hpp). The difference between the two runs is one
layer's. With --table FILE the per-launch-site table of the L-layer run goes to FILE
(PPTRAIN_EMULATED_KERNEL_TABLE; it covers all STEPS steps and the start).
Usage: emulated_counters.py PPTRAIN_EMULATED CONFIG [--table FILE] [KEY=VALUE ...]
"""
import json
import os
import subprocess
import sys
import tempfile

STEPS = 2
DEFAULTS = ["model.d_model=64", "model.seq_len=64", "device=cuda", "train.precision=bf16",
            "parallel.micro_batches=1", "parallel.micro_batch_size=4", "checkpoint.dir=",
            "train.eval_every=0", "train.eval_batches=1", f"train.steps={STEPS}"]
KEYS = ["kernel_launches", "global_bytes", "shared_bytes", "mma_ops"]


def counters(binary, config, sets, layers, work, table=None):
    metrics = os.path.join(work, f"m{layers}.jsonl")
    env = dict(os.environ, PPTRAIN_EMULATED_GPUS="1")
    if table:
        env["PPTRAIN_EMULATED_KERNEL_TABLE"] = table
    argv = [binary, "--config", config]
    for s in DEFAULTS + sets + [f"model.n_layer={layers}", f"logging.metrics={metrics}"]:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1200, env=env)
    if out.returncode != 0:
        sys.exit(f"pptrain-emulated exited {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    with open(metrics) as f:
        last = [json.loads(line) for line in f if line.strip()][-1]
    return [int(last[k]) for k in KEYS]


def main():
    args = sys.argv[1:]
    table = None
    if "--table" in args:
        i = args.index("--table")
        table = args[i + 1]
        del args[i:i + 2]
    if len(args) < 2:
        sys.exit(__doc__)
    binary, config, sets = args[0], args[1], args[2:]
    layers = 12
    for s in sets:
        if s.startswith("model.n_layer="):
            layers = int(s.split("=", 1)[1])
    sets = [s for s in sets if not s.startswith("model.n_layer=")]
    with tempfile.TemporaryDirectory() as work:
        step = counters(binary, config, sets, layers, work, table)
        more = counters(binary, config, sets, layers + 1, work)
    print(f"{' '.join(DEFAULTS + sets)}, {layers} layers")
    print("| | " + " | ".join(KEYS) + " |")
    print("|---|" + "---:|" * len(KEYS))
    print(f"| a step | " + " | ".join(f"{v:,}" for v in step) + " |")
    print(f"| a layer | " + " | ".join(f"{b - a:,}" for a, b in zip(step, more)) + " |")


if __name__ == "__main__":
    main()
