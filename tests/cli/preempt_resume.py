#!/usr/bin/env python3
"""Preemption: SIGTERM during training stops the run after the current step with a
checkpoint and exit code 4; resuming with checkpoint.resume: auto continues with losses
bit-identical to an uninterrupted run.
Usage: preempt_resume.py PPTRAIN CONFIG WORKDIR [--set overrides...]"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

STEPS = 120


def args_for(pptrain, config, work, name, extra):
    out = [pptrain, "--config", config]
    for s in [f"train.steps={STEPS}", "train.threads=1", "train.eval_every=0", "logging.every=1",
              f"checkpoint.dir={work}/{name}/ckpt", "checkpoint.every=0",
              f"logging.metrics={work}/{name}/metrics.jsonl"] + extra:
        out += ["--set", s]
    return out


def losses(work, name):
    with open(f"{work}/{name}/metrics.jsonl") as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def main():
    pptrain, config, work = sys.argv[1:4]
    extra = [a for a in sys.argv[4:] if a != "--set"]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    subprocess.run(args_for(pptrain, config, work, "whole", extra), check=True,
                   capture_output=True, timeout=600)
    whole = losses(work, "whole")

    run = subprocess.Popen(args_for(pptrain, config, work, "split", extra),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    metrics = f"{work}/split/metrics.jsonl"
    while time.time() < deadline:  # signal once a few steps are done
        if os.path.exists(metrics) and sum(1 for _ in open(metrics)) >= 5:
            break
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    out = run.communicate(timeout=120)[0].decode()
    if run.returncode != 4:
        sys.exit(f"interrupted run exited {run.returncode}, expected 4:\n{out}")
    stopped_at = max(losses(work, "split"))
    if stopped_at >= STEPS:
        sys.exit("the run finished before the signal arrived; nothing was tested")
    resumed = subprocess.run(args_for(pptrain, config, work, "split", extra + ["checkpoint.resume=auto"]),
                             capture_output=True, text=True, timeout=600)
    if resumed.returncode != 0:
        sys.exit(f"resume exited {resumed.returncode}:\n{resumed.stdout}{resumed.stderr}")
    split = losses(work, "split")
    differ = [s for s in whole if split.get(s) != whole[s]]
    if differ:
        sys.exit(f"stopped at step {stopped_at}; losses differ from the uninterrupted run at steps {differ[:5]}")
    print(f"stopped at step {stopped_at} with exit 4; resumed; all {STEPS} losses bit-identical")
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
