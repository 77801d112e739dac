#!/usr/bin/env python3
"""Smoke test of scripts/plot_run.py: plots a small generated metrics file and trace and
checks that each PNG is written, and that a bad input file gives exit code 2.
Exits 77 (skipped) when matplotlib cannot be imported.

Usage: plot_smoke.py PLOT_RUN_PY
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics_lines():
    """Ten steps of metrics records as pptrain writes them, two with val_loss."""
    for step in range(1, 11):
        rec = {"step": step, "loss": 5.5 - 0.3 * step, "lr": 1e-3, "grad_norm": 1.0,
               "tokens_per_s": 1000.0 + 10 * step, "step_time_s": 0.1,
               "bubble": 0.3, "bubble_min": 0.2, "bubble_max": 0.4, "bubble_theory": 0.25,
               "bubble_sim": 0.28}
        if step % 5 == 0:
            rec["val_loss"] = 5.6 - 0.3 * step
        yield json.dumps(rec)


def trace_doc():
    """Steps 3 and 4 of a two-stage 1F1B pipeline with two micro-batches."""
    events = []
    for rank in range(2):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": rank,
                       "args": {"name": f"rank {rank}"}})
        for step, t in ((3, 0.0), (4, 10000.0)):
            ops = (["Forward mb0", "SendForward mb0", "Forward mb1", "SendForward mb1",
                    "RecvBackward mb0", "BackwardInput mb0", "BackwardWeight mb0",
                    "RecvBackward mb1", "BackwardInput mb1", "BackwardWeight mb1"] if rank == 0
                   else ["RecvForward mb0", "Forward mb0", "BackwardInput mb0",
                         "SendBackward mb0", "BackwardWeight mb0", "RecvForward mb1",
                         "Forward mb1", "BackwardInput mb1", "SendBackward mb1",
                         "BackwardWeight mb1"]) + ["optimizer"]
            for name in ops:
                dur = 20.0 if name.startswith(("Send", "Recv")) else 500.0
                events.append({"name": name, "ph": "X", "pid": 0, "tid": rank, "ts": t,
                               "dur": dur, "args": {"step": step}})
                t += dur + 50.0
            # Communication on a track of its own: not a row of the timeline.
            events.append({"name": "all_reduce 0.5 MiB", "ph": "X", "pid": 0, "tid": 10000 + 64 * rank + 1,
                           "ts": t - 600.0, "dur": 400.0,
                           "args": {"step": step, "track": "dp(tp=0,pp=0)"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def main():
    script = sys.argv[1]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not importable: skipped")
        return SKIP
    work = tempfile.mkdtemp(prefix="pptrain-plots-")
    failures = []

    def plot(args, expect_rc, png=None):
        p = subprocess.run([sys.executable, script] + args, capture_output=True, text=True,
                           timeout=60)
        if p.returncode != expect_rc:
            failures.append(f"{args}: exit {p.returncode}, expected {expect_rc}\n{p.stdout}{p.stderr}")
        elif png:
            with open(png, "rb") as f:
                head = f.read(8)
            if head != PNG_MAGIC or os.path.getsize(png) < 1000:
                failures.append(f"{args}: {png} is not a PNG")
        return p

    try:
        metrics = os.path.join(work, "metrics.jsonl")
        with open(metrics, "w") as f:
            f.write("\n".join(metrics_lines()) + "\n")
        trace = os.path.join(work, "trace.json")
        with open(trace, "w") as f:
            json.dump(trace_doc(), f)
        run_png, tl_png = os.path.join(work, "run.png"), os.path.join(work, "tl.png")
        plot(["metrics", metrics, "-o", run_png], 0, run_png)
        plot(["trace", trace, "-o", tl_png], 0, tl_png)
        plot(["trace", trace, "--step", "4", "-o", tl_png], 0, tl_png)
        p = plot(["trace", trace, "--step", "7", "-o", tl_png], 2)
        if "step 7 is not in the trace" not in p.stderr:
            failures.append(f"missing step: unexpected message {p.stderr!r}")
        bad = os.path.join(work, "bad.jsonl")
        with open(bad, "w") as f:
            f.write('{"step": 1, "loss": 2}\nnot json\n')
        p = plot(["metrics", bad, "-o", run_png], 2)
        if "bad.jsonl:2:" not in p.stderr:
            failures.append(f"bad metrics line: unexpected message {p.stderr!r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    if not failures:
        print("ok: run.png and timeline PNGs written, bad inputs give exit 2")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
