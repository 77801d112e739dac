#!/usr/bin/env python3
"""The trace shows the communication beside compute on tracks of its own.

Trains (pp 2, dp 2) on CPU ranks, or on emulated GPUs with --device cuda, tracing step 2,
and checks the merged trace: every rank has its compute track ("rank r") and, sorted
right below it, a track for its data-parallel group's bucket reductions and for its
pipeline messages (on GPUs, one per NCCL channel: "pipeline-channel-K(a->b)"), each with
slices of the traced step only, which lie inside the step's span on that rank.
Usage: trace_tracks.py PPTRAIN CONFIG WORKDIR [--device cuda]
"""
import collections
import json
import os
import shutil
import subprocess
import sys


def main():
    pptrain, config, work = sys.argv[1:4]
    device = sys.argv[5] if len(sys.argv) > 5 and sys.argv[4] == "--device" else "cpu"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    trace = os.path.join(work, "trace.json")
    sets = ["model.n_layer=4", "model.n_head=2", "model.d_model=32", "model.seq_len=16",
            "model.vocab_size=64", "parallel.pp=2", "parallel.dp=2", "parallel.micro_batches=2",
            "train.steps=3", "train.eval_every=0", "train.threads=1", "checkpoint.dir=",
            f"logging.trace={trace}", "logging.trace_steps=[2]", f"device={device}",
            "parallel.comm_timeout_s=120"]
    if device == "cuda":
        sets.append("train.precision=fp32")
    argv = [pptrain, "--config", config]
    for s in sets:
        argv += ["--set", s]
    env = dict(os.environ, PPTRAIN_EMULATED_GPUS="8")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    if out.returncode != 0:
        sys.exit(f"run failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    with open(trace) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    sort = {e["tid"]: e["args"]["sort_index"] for e in events if e.get("name") == "thread_sort_index"}
    slices = [e for e in events if e.get("ph") == "X"]
    failures = []
    by_track = collections.defaultdict(list)
    for e in slices:
        by_track[names.get(e["tid"], "?")].append(e)
    for rank in range(4):
        compute = by_track.get(f"rank {rank}", [])
        tracks = sorted(t for t in by_track if t.startswith(f"rank {rank}: "))
        dp = [t for t in tracks if ": dp(" in t]
        pipe = [t for t in tracks if (": pipeline-channel-" if device == "cuda" else ": messages") in t]
        print(f"rank {rank}: {len(compute)} compute slices; tracks {', '.join(t.split(': ')[1] for t in tracks)}")
        if not compute or len(dp) != 1 or not pipe:
            failures.append(f"rank {rank}: compute, dp and pipeline tracks expected, got {tracks}")
            continue
        tid = compute[0]["tid"]
        start = min(e["ts"] for e in compute)
        end = max(e["ts"] + e["dur"] for e in compute)
        for t in dp + pipe:
            track_tid = by_track[t][0]["tid"]
            if not sort[tid] < sort[track_tid] < sort[tid] + 64:
                failures.append(f"{t}: not sorted right below rank {rank}")
            for e in by_track[t]:
                if e["args"].get("step") != 2 or e["args"].get("track") != t.split(": ", 1)[1]:
                    failures.append(f"{t}: slice {e['name']} is not of step 2's track")
                if not (start - 1 <= e["ts"] and e["ts"] + e["dur"] <= end + 1):
                    failures.append(f"{t}: slice {e['name']} outside the step ({e['ts']} + "
                                    f"{e['dur']} against [{start}, {end}])")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
