#!/usr/bin/env python3
"""Peak memory per rank and step time against context parallelism, on CPU ranks.

For each sequence length and cp degree: the peak memory check-config predicts for the
heaviest rank, the CPU backend's measured peak (peak_memory_mib, max over ranks and
steps) and the median step time after the first step. The model is small (so that
attention's activations dominate); one sequence per micro-batch. Prints a markdown
table for docs/performance.md.
Usage: cp_scaling.py PPTRAIN CONFIG [--seq 8192 16384] [--cp 1 2 4] [--steps 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

MODEL = ["model.n_layer=2", "model.n_head=4", "model.d_model=64", "model.vocab_size=256",
         "parallel.micro_batch_size=1", "parallel.micro_batches=1", "train.threads=1",
         "train.eval_every=0", "train.eval_batches=1", "logging.every=1", "checkpoint.dir=",
         "parallel.comm_timeout_s=600", "train.memory_check=off"]


def args_for(config, seq, cp, steps, metrics=None):
    sets = MODEL + [f"model.seq_len={seq}", f"parallel.cp={cp}", f"train.steps={steps}"]
    if metrics:
        sets.append(f"logging.metrics={metrics}")
    out = ["--config", config]
    for s in sets:
        out += ["--set", s]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pptrain")
    ap.add_argument("config")
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    print("| seq_len | cp | predicted MiB | measured MiB | step s | step s x cp |")
    print("|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        for seq in a.seq:
            for cp in a.cp:
                plan = subprocess.run([a.pptrain, "check-config", "--json"] +
                                      args_for(a.config, seq, cp, a.steps),
                                      capture_output=True, text=True, check=True)
                predicted = json.loads(plan.stdout)["predicted_peak_memory_mib"]
                metrics = os.path.join(work, f"{seq}_{cp}.jsonl")
                subprocess.run([a.pptrain] + args_for(a.config, seq, cp, a.steps, metrics),
                               capture_output=True, text=True, check=True)
                rows = [json.loads(l) for l in open(metrics)]
                measured = max(r["peak_memory_mib"] for r in rows)
                step = statistics.median(r["step_time_s"] for r in rows[1:] or rows)
                print(f"| {seq} | {cp} | {predicted:.1f} | {measured:.1f} | {step:.2f} | "
                      f"{step * cp:.2f} |", flush=True)


if __name__ == "__main__":
    main()
