#!/usr/bin/env python3
"""Gradient-reduction overlap on CPU ranks: each layout with parallel.overlap true and
false, in alternating rounds of one run, so a shared machine's drifting load weighs on
both sides alike.

Per layout and setting it prints the medians over rounds of: the step time (median of
the steps after the first two), `comm_s` (the exposed part of the reductions: what the
step still waits for after the schedule, mean over ranks), and the on/off ratios.
The model: 4 layers, d_model 256, seq_len 128, vocab 4096 (2.6M parameters, ~10 MB of
fp32 gradients a replica), 4 micro-batches of 4, one thread a rank.

Usage: overlap_ab.py [--rounds R] [--steps N] [--only NAME ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PPTRAIN = os.path.join(ROOT, "build", "pptrain")
TINY = os.path.join(ROOT, "configs", "tiny.yaml")
MODEL = ["model.n_layer=4", "model.n_head=4", "model.d_model=256", "model.seq_len=128",
         "model.vocab_size=4096", "parallel.micro_batch_size=4", "parallel.micro_batches=4",
         "train.threads=1", "train.eval_every=0", "checkpoint.dir=", "logging.every=1"]
# name: (tp, pp, dp, overrides); 1 MiB buckets cut the 10 MB of gradients into about ten.
LAYOUTS = {"dp2": (1, 1, 2, []), "pp2_dp2": (1, 2, 2, []), "tp2_pp2_dp2": (2, 2, 2, []),
           "dp2_1mib": (1, 1, 2, ["parallel.grad_bucket_mib=1"]),
           "dp2_zero1": (1, 1, 2, ["parallel.zero=1"]),
           "dp2_zero1_1mib": (1, 1, 2, ["parallel.zero=1", "parallel.grad_bucket_mib=1"]),
           "pp2_dp2_zero1_1mib": (1, 2, 2, ["parallel.zero=1", "parallel.grad_bucket_mib=1"])}


def run(tp, pp, dp, extra, overlap, steps, work):
    metrics = os.path.join(work, f"m_{tp}{pp}{dp}_{overlap}.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    sets = MODEL + extra + [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
                    f"parallel.overlap={str(overlap).lower()}", f"train.steps={steps}",
                    f"logging.metrics={metrics}"]
    argv = [PPTRAIN, "--config", TINY]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"{tp},{pp},{dp} overlap {overlap}: exit {out.returncode}\n{out.stderr[-2000:]}")
    rows = [json.loads(line) for line in open(metrics)][2:]
    return (statistics.median(r["step_time_s"] for r in rows),
            statistics.median(r["comm_s"] for r in rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--only", nargs="*", default=list(LAYOUTS))
    args = ap.parse_args()
    env_note = os.environ.get("OMPI_MCA_btl_vader_eager_limit", "default")
    print(f"rounds {args.rounds}, steps {args.steps} (medians of steps 3..), "
          f"vader eager limit {env_note}")
    print(f"{'layout':20} {'step on s':>10} {'step off s':>10} {'on/off':>7} "
          f"{'comm on s':>10} {'comm off s':>10}")
    with tempfile.TemporaryDirectory() as work:
        for name in args.only:
            tp, pp, dp, extra = LAYOUTS[name]
            got = {True: [], False: []}
            for _ in range(args.rounds):
                for overlap in (True, False):
                    got[overlap].append(run(tp, pp, dp, extra, overlap, args.steps, work))
            step = {k: statistics.median(v[0] for v in got[k]) for k in got}
            comm = {k: statistics.median(v[1] for v in got[k]) for k in got}
            print(f"{name:20} {step[True]:10.4f} {step[False]:10.4f} "
                  f"{step[True] / step[False]:7.3f} {comm[True]:10.4f} {comm[False]:10.4f}",
                  flush=True)


if __name__ == "__main__":
    main()
