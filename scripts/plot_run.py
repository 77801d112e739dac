#!/usr/bin/env python3
"""Plots of a pptrain run: its metrics over the steps, or one step's pipeline timeline.

  plot_run.py metrics METRICS.jsonl -o run.png
      Three panels over the steps: training loss (validation loss as points), tokens/s,
      and the pipeline bubble (mean over ranks, a band from the least to the most idle
      rank, the schedule's theoretical bubble, and the schedule simulated at each step's
      measured forward, backward-input and backward-weight times). The metrics file is
      appended to by every run that names it, so where a step occurs more than once its
      last record wins.

  plot_run.py trace TRACE.json -o timeline.png [--step N]
      One row per rank of a traced step (default: the first one in the trace): forward,
      backward-input and backward-weight slices labelled with their micro-batch,
      messages as thin grey bars, the optimizer step, and the idle time between them
      (the bubble) in the row's background, and each rank's idle share of the step.
      Time in ms from the step's first slice.

Needs matplotlib. Exit codes: 0 written; 2 bad arguments or input file.
"""
import argparse
import json
import math
import os
import sys

# Slice kinds of the trace: (label in the legend, colour); None marks messages.
KINDS = {
    "F": ("forward", "#4C72B0"),
    "B": ("backward (input)", "#DD8452"),
    "W": ("backward (weight)", "#55A868"),
    "opt": ("optimizer", "#8172B3"),
    "msg": ("send / recv (a recv includes its wait)", "#7F7F7F"),
    "other": ("other", "#CCB974"),
}
IDLE_COLOUR = "#F6D6D6"


class InputProblem(Exception):
    """A bad input file; the message names the file and the problem."""


def kind_of(name):
    """The slice kind of a trace event name such as 'BackwardInput mb3 c1'."""
    op = name.split(" ", 1)[0]
    if op == "Forward":
        return "F"
    if op in ("BackwardInput", "Backward"):
        return "B"
    if op == "BackwardWeight":
        return "W"
    if op == "optimizer":
        return "opt"
    if op.startswith("Send") or op.startswith("Recv"):
        return "msg"
    return "other"


def slice_label(name):
    """'3' for 'Forward mb3', '3.1' for chunk 1 of micro-batch 3; '' when there is none."""
    mb = chunk = ""
    for part in name.split()[1:]:
        if part.startswith("mb"):
            mb = part[2:]
        elif part.startswith("c"):
            chunk = part[1:]
    return mb + ("." + chunk if chunk and mb else "")


def read_metrics(path):
    """The records of a JSON Lines metrics file, one per step (the last wins), by step."""
    by_step = {}
    try:
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputProblem(f"{path}:{number}: not a JSON object ({e.msg})") from None
                if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
                    raise InputProblem(f"{path}:{number}: record has no integer 'step'")
                by_step[rec["step"]] = rec
    except OSError as e:
        raise InputProblem(f"{path}: cannot read: {e.strerror}") from None
    if not by_step:
        raise InputProblem(f"{path}: holds no metrics records")
    return [by_step[s] for s in sorted(by_step)]


def series(records, key):
    """(steps, values) of the records that have a finite number under key."""
    xs, ys = [], []
    for r in records:
        v = r.get(key)
        if isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def plot_metrics(path, out, title):
    records = read_metrics(path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_tok, ax_bub) = plt.subplots(3, 1, figsize=(8, 7.5), sharex=True)
    fig.suptitle(title or f"pptrain run: {os.path.basename(path)}", fontsize=11)
    markers = len(records) <= 60  # points on each record while they stay readable

    xs, ys = series(records, "loss")
    ax_loss.plot(xs, ys, color=KINDS["F"][1], marker="." if markers else None, label="train loss")
    xs, ys = series(records, "val_loss")
    if xs:
        ax_loss.plot(xs, ys, "o", color=KINDS["B"][1], label="validation loss", zorder=3)
    ax_loss.set_ylabel("loss (nats)")
    ax_loss.legend(loc="upper right", fontsize=8)

    xs, ys = series(records, "tokens_per_s")
    ax_tok.plot(xs, ys, color=KINDS["W"][1], marker="." if markers else None)
    ax_tok.set_ylabel("tokens / s")
    ax_tok.set_ylim(bottom=0)

    xs, ys = series(records, "bubble")
    lo_x, lo = series(records, "bubble_min")
    hi_x, hi = series(records, "bubble_max")
    if xs and lo_x == xs and hi_x == xs:
        ax_bub.fill_between(xs, lo, hi, color=KINDS["opt"][1], alpha=0.2,
                            label="min-max over ranks")
    ax_bub.plot(xs, ys, color=KINDS["opt"][1], marker="." if markers else None,
                label="measured (mean over ranks)")
    xs, ys = series(records, "bubble_theory")
    if xs:
        ax_bub.plot(xs, ys, "--", color="black", linewidth=1, label="theoretical (schedule)")
    xs, ys = series(records, "bubble_sim")
    if xs:
        ax_bub.plot(xs, ys, ":", color="black", linewidth=1,
                    label="simulated at the step's measured F, B, W")
    ax_bub.set_ylabel("bubble (idle fraction)")
    ax_bub.set_ylim(0, 1)
    ax_bub.set_xlabel("step")
    ax_bub.legend(loc="upper right", fontsize=8)

    for ax in (ax_loss, ax_tok, ax_bub):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"{out}: {len(records)} steps from {path}")


def read_trace(path):
    """(slices, rank names) of a Chrome-trace file: slices are the ranks' 'X' events (not
    the communication tracks'), names by tid."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputProblem(f"{path}: cannot read: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise InputProblem(f"{path}:{e.lineno}: not JSON ({e.msg})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputProblem(f"{path}: not a Chrome trace (no traceEvents list)")
    slices, names = [], {}
    for e in events:
        if not isinstance(e, dict):
            continue
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e.get("tid")] = str(e.get("args", {}).get("name", e.get("tid")))
        elif e.get("ph") == "X" and all(isinstance(e.get(k), (int, float)) for k in ("ts", "dur")):
            args = e.get("args")
            if isinstance(args, dict) and "track" in args:
                continue  # communication beside compute, on a track of its own
            slices.append(e)
    if not slices:
        raise InputProblem(f"{path}: holds no slices ('X' events)")
    return slices, names


def step_of(event):
    args = event.get("args")
    return args.get("step") if isinstance(args, dict) else None


def plot_trace(path, out, step, title):
    slices, names = read_trace(path)
    steps = sorted({s for s in map(step_of, slices) if s is not None})
    if step is None:
        step = steps[0] if steps else None
    elif step not in steps:
        raise InputProblem(f"{path}: step {step} is not in the trace (traced: "
                           f"{', '.join(map(str, steps)) or 'none'})")
    chosen = [e for e in slices if step_of(e) == step]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted({e.get("tid", 0) for e in chosen}, key=lambda t: (str(type(t)), t))
    row = {tid: i for i, tid in enumerate(ranks)}
    t0 = min(e["ts"] for e in chosen)
    end = max(e["ts"] + e["dur"] for e in chosen)
    span_ms = (end - t0) / 1000.0

    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(ranks)))
    used = set()
    for tid in ranks:  # idle background: whatever a rank's slices leave uncovered
        ax.broken_barh([(0, span_ms)], (row[tid] - 0.4, 0.8), color=IDLE_COLOUR, linewidth=0)
    for e in chosen:
        kind = kind_of(str(e.get("name", "")))
        used.add(kind)
        x, w = (e["ts"] - t0) / 1000.0, e["dur"] / 1000.0
        y = row[e.get("tid", 0)]
        h = 0.2 if kind == "msg" else 0.8
        edge = kind in ("F", "B", "W")  # a thin white edge keeps neighbours apart
        ax.broken_barh([(x, w)], (y - h / 2, h), color=KINDS[kind][1],
                       edgecolor="white" if edge else "none", linewidth=0.5 if edge else 0)
        label = slice_label(str(e.get("name", ""))) if kind in ("F", "B", "W") else ""
        if label and w > span_ms * 0.012:
            ax.text(x + w / 2, y, label, ha="center", va="center", fontsize=7, color="white")
    # Each row's label gives the share of the step its rank spent not computing.
    busy = {tid: 0.0 for tid in ranks}
    for e in chosen:
        if kind_of(str(e.get("name", ""))) != "msg":
            busy[e.get("tid", 0)] += e["dur"] / 1000.0
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"{names.get(t, f'rank {t}')}\nidle {1 - busy[t] / span_ms:.0%}"
                        for t in ranks], fontsize=9)
    ax.set_ylim(len(ranks) - 0.5, -0.5)  # rank 0 on top
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("time in the step (ms)")
    ax.set_title(title or f"pipeline timeline: step {step} of {os.path.basename(path)}", fontsize=11)
    handles = [Patch(color=KINDS[k][1], label=KINDS[k][0]) for k in KINDS if k in used]
    handles.append(Patch(color=IDLE_COLOUR, label="idle (bubble)"))
    height = fig.get_size_inches()[1]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.25 / height, 1, 1))  # room for the legend below
    fig.savefig(out, dpi=100)
    print(f"{out}: step {step}, {len(ranks)} ranks, {span_ms:.1f} ms from {path}")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("metrics", help="loss, tokens/s and bubble over the steps")
    m.add_argument("file", help="metrics JSON Lines (logging.metrics)")
    t = sub.add_parser("trace", help="pipeline timeline of one traced step")
    t.add_argument("file", help="Chrome-trace JSON (logging.trace)")
    t.add_argument("--step", type=int, help="traced step to draw (default: the first)")
    for p in (m, t):
        p.add_argument("-o", "--output", required=True, help="PNG file to write")
        p.add_argument("--title", help="figure title (default names the input)")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_run.py: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    try:
        if args.what == "metrics":
            plot_metrics(args.file, args.output, args.title)
        else:
            plot_trace(args.file, args.output, args.step, args.title)
    except InputProblem as e:
        print(f"plot_run.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
