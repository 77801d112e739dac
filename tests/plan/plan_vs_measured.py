#!/usr/bin/env python3
"""The planner's predictions against measured runs on this machine's CPU ranks.

Calibrates this machine (`pptrain plan --calibrate`), then for each layout below trains a
few steps and compares `pptrain plan --this --json` with the run: the predicted step time
with the median measured `step_time_s` (steps after the first two), and the predicted
peak memory with the measured `peak_memory_mib`. Prints the table docs/performance.md
records. Fails when memory differs by more than 5%, or, where every rank has a core of
its own, a step time by more than a factor of 2: a gross error of the model, robust to a
noisy machine (the 15% target is a figure to read in the table, not a timed test).
Layouts with more ranks than cores are marked oversubscribed and their time unchecked.
Usage: plan_vs_measured.py PPTRAIN CONFIG WORKDIR
"""
import json
import os
import shutil
import statistics
import subprocess
import sys

STEPS = 8
MODEL = ["model.n_layer=4", "model.n_head=4", "model.d_model=256", "model.seq_len=128",
         "model.vocab_size=512", "parallel.micro_batch_size=4", f"train.steps={STEPS}",
         "train.threads=1", "train.eval_every=0", "logging.every=1", "checkpoint.dir=",
         "parallel.comm_timeout_s=120"]
# name: (tp, pp, dp, micro_batches, overrides); 16 sequences per step.
LAYOUTS = {
    "1 rank": (1, 1, 1, 4, []),
    "1 rank, full recompute": (1, 1, 1, 4, ["train.recompute=full"]),
    "tp2": (2, 1, 1, 4, []),
    "tp2 SP": (2, 1, 1, 4, ["parallel.sequence_parallel=true"]),
    "dp2": (1, 1, 2, 2, []),
    "dp2 ZeRO-1": (1, 1, 2, 2, ["parallel.zero=1"]),
    "pp2 gpipe": (1, 2, 1, 4, ["parallel.schedule=gpipe"]),
    "pp2 1f1b": (1, 2, 1, 4, []),
    "pp2 interleaved": (1, 2, 1, 4, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
    "pp2 interleaved grouped": (1, 2, 1, 4, ["parallel.schedule=interleaved", "parallel.virtual_stages=2",
                                             "parallel.message_mode=grouped"]),
    "pp2 zb-h1": (1, 2, 1, 4, ["parallel.schedule=zb-h1"]),
    "pp2 zb-v": (1, 2, 1, 4, ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
    "(2,2,2)": (2, 2, 2, 2, []),
}


def sets(args):
    out = []
    for s in args:
        out += ["--set", s]
    return out


def main():
    pptrain, config, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cluster = os.path.join(work, "here.yaml")
    r = subprocess.run([pptrain, "plan", "--calibrate", "--out", cluster], capture_output=True,
                       text=True, timeout=300)
    if r.returncode != 0:
        sys.exit(f"calibration failed:\n{r.stdout}\n{r.stderr}")
    print((r.stdout + r.stderr).strip().splitlines()[-1])
    cores = os.cpu_count() or 1
    failures = []
    print(f"{'layout':24} {'ranks':>5} {'step s predicted':>17} {'measured':>9} {'ratio':>6}"
          f" {'MiB predicted':>14} {'measured':>9} {'error':>7}")
    for name, (tp, pp, dp, mb, extra) in LAYOUTS.items():
        layout = MODEL + extra + [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
                                  f"parallel.micro_batches={mb}"]
        ranks = tp * pp * dp
        # The cluster file's node holds `cores` ranks; a layout of other size uses its own.
        with open(cluster) as f:
            text = f.read().replace(f"gpus_per_node: {cores}", f"gpus_per_node: {ranks}")
        own = os.path.join(work, f"cluster_{ranks}.yaml")
        with open(own, "w") as f:
            f.write(text)
        plan = subprocess.run([pptrain, "plan", "--this", "--json", "--config", config, "--cluster",
                               own] + sets(layout), capture_output=True, text=True, timeout=120)
        if plan.returncode != 0:
            sys.exit(f"{name}: plan exited {plan.returncode}\n{plan.stderr}")
        predicted = json.loads(plan.stdout)[0]
        metrics = os.path.join(work, name.replace(" ", "_").replace(",", "") + ".jsonl")
        run = subprocess.run([pptrain, "--config", config] + sets(layout + [f"logging.metrics={metrics}"]),
                             capture_output=True, text=True, timeout=600)
        if run.returncode != 0:
            sys.exit(f"{name}: pptrain exited {run.returncode}\n{run.stdout}\n{run.stderr}")
        rows = [json.loads(line) for line in open(metrics)]
        step = statistics.median(r["step_time_s"] for r in rows[2:])
        memory = max(r["peak_memory_mib"] for r in rows)
        ratio = predicted["step_time_s"] / step
        error = (predicted["peak_memory_mib"] - memory) / memory
        memory_ok = abs(error) <= 0.05
        time_ok = ranks > cores or 0.5 <= ratio <= 2.0
        note = "" if ranks <= cores else " (oversubscribed)"
        ok = memory_ok and time_ok
        print(f"{name:24} {ranks:>5} {predicted['step_time_s']:>17.4f} {step:>9.4f} {ratio:>6.2f}"
              f" {predicted['peak_memory_mib']:>14.2f} {memory:>9.2f} {error:>+7.1%}"
              f" {'ok' if ok else 'FAIL'}{note}")
        if not ok:
            failures.append(name)
    if failures:
        sys.exit("predictions off: " + ", ".join(failures))
    print(f"{len(LAYOUTS)} passed, 0 failed")


if __name__ == "__main__":
    main()
