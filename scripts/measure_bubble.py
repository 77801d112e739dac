#!/usr/bin/env python3
"""Tables for scripts/measure_bubble.sh from the metrics files of its runs.

The manifest has one line per run: pp, m, schedule, virtual stages, the CPU share
other processes took while it ran, and then either the run's metrics.jsonl (the
trainer's per-step records, step 1 first) or FAILED and why.

  measure_bubble.py disturbed MANIFEST MAX_OTHER
      prints "pp m schedule" for each configuration without failures whose least
      disturbed run saw other processes take more than MAX_OTHER of the CPU
  measure_bubble.py report MANIFEST
      prints the markdown table, zb-h1's and zb-v's idle time over 1f1b's beside the ZB
      paper's expectation from F, B and W measured in that run's trace (metrics file
      name with .trace.json for .jsonl), and the failed runs
"""
import json
import os
import statistics
import sys

SCHEDULES = ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"]


class Config:
    def __init__(self, v):
        self.v = v
        self.runs = []      # (other share, timed step records, metrics path); step 1 is warm-up
        self.failed = []    # why each failed run failed

    def best(self):
        """The run other processes disturbed least."""
        return min(self.runs, key=lambda run: run[0])


def read_manifest(path):
    """{(pp, m, schedule): Config}"""
    configs = {}
    with open(path) as f:
        for line in f:
            pp, m, sched, v, other, rest = line.split(maxsplit=5)
            c = configs.setdefault((int(pp), int(m), sched), Config(int(v)))
            if rest.startswith("FAILED"):
                c.failed.append(rest[len("FAILED"):].strip())
            else:
                with open(rest.strip()) as g:
                    c.runs.append((float(other), [json.loads(rec) for rec in g][1:], rest.strip()))
    return configs


def action_times(metrics_path):
    """Median milliseconds of Forward, BackwardInput and BackwardWeight slices over all
    ranks in the run's trace, or None without a trace."""
    path = metrics_path[: -len(".jsonl")] + ".trace.json"
    if not os.path.exists(path):
        return None
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    times = {}
    for op in ("Forward", "BackwardInput", "BackwardWeight"):
        durations = [e["dur"] / 1e3 for e in events if e.get("ph") == "X" and e["name"].split()[0] == op]
        if not durations:
            return None
        times[op] = statistics.median(durations)
    return times["Forward"], times["BackwardInput"], times["BackwardWeight"]


def median(records, f):
    return statistics.median(f(r) for r in records)


def idle(r):
    # A rank's own bubble ends at its last action; its idle time after that (the later
    # stages wait for stage 0's last backward passes) falls into comm_s, the gradient
    # all-reduce that ends together on every rank. The simulator counts it too.
    return r["wait_s"] + r["comm_s"]


def closed_form(sched, pp, m, v):
    """Bubble fraction: gpipe and 1f1b (p-1)/(m+p-1); interleaved (Megatron) bubble time
    divided by v, (p-1)/(v*m+p-1); zb-h1 (ZB paper, F = B = W) a third of 1f1b's bubble
    time, (p-1)/(3m+p-1); zb-v (list-scheduled, F = B = W) about (p-1)/(6m+p-1), the p-1
    chunk units the last stage waits for its first input (exact for large m)."""
    per_mb = {"gpipe": 1, "1f1b": 1, "interleaved": v, "zb-h1": 3, "zb-v": 6}[sched]
    return (pp - 1) / (per_mb * m + pp - 1)


def disturbed(manifest, max_other):
    for key, c in sorted(read_manifest(manifest).items()):
        if c.runs and not c.failed and c.best()[0] > max_other:
            print(*key)


def report(manifest):
    configs = read_manifest(manifest)
    print("| pp |  m | schedule    | runs | other | bubble | min   | max   | whole | sim   "
          "| sim@FBW | closed | compute ms | idle ms | act | RSS MiB | step s |")
    print("|----|----|-------------|------|-------|--------|-------|-------|-------|-------"
          "|---------|--------|------------|---------|-----|---------|--------|")
    idle_s = {}
    for key in sorted(configs, key=lambda k: (k[0], k[1], SCHEDULES.index(k[2]))):
        pp, m, sched = key
        c = configs[key]
        if not c.runs:
            print(f"| {pp:>2} | {m:>2} | {sched:<11} | FAILED: {c.failed[0]} |")
            continue
        other, t, _ = c.best()
        med = lambda f: median(t, f)
        idle_s[key] = med(idle)
        whole = med(lambda r: idle(r) / (r["compute_s"] + idle(r)))
        print(f"| {pp:>2} | {m:>2} | {sched:<11} | {len(c.runs):>4} | {other * 100:>4.0f}% | "
              f"{med(lambda r: r['bubble']):>6.3f} | {med(lambda r: r['bubble_min']):.3f} | "
              f"{med(lambda r: r['bubble_max']):.3f} | {whole:>5.3f} | {t[0]['bubble_theory']:.3f} | "
              f"{med(lambda r: r.get('bubble_sim', float('nan'))):>7.3f} | "
              f"{closed_form(sched, pp, m, c.v):>6.3f} | {med(lambda r: r['compute_s']) * 1e3:>10.1f} | "
              f"{idle_s[key] * 1e3:>7.1f} | {max(r['peak_activations'] for r in t):>3} | "
              f"{max(r['peak_rss_mib'] for r in t):>7.0f} | {med(lambda r: r['step_time_s']):>6.3f} |")
    print()
    # The ZB paper's bubble times, over 1F1B's (p-1)(F+B+W): ZB-H1 (p-1)(F+B-W), and
    # (p-1)(F+B-2W) (zero when F = B = W) for ZB-V, which reaches ZB-H2's bubble with
    # 1F1B's memory.
    expected = {"zb-h1": lambda f, b, w: (f + b - w) / (f + b + w),
                "zb-v": lambda f, b, w: max(0.0, f + b - 2 * w) / (f + b + w)}
    print("zb-h1's and zb-v's idle time per rank over 1f1b's; the ZB paper expects "
          "(F+B-W)/(F+B+W) and (F+B-2W)/(F+B+W):")
    for (pp, m, sched), s in sorted(idle_s.items()):
        base = idle_s.get((pp, m, "1f1b"))
        if sched not in expected or not base:
            continue
        line = f"  {sched:5} pp {pp}, m {m:>2}: {s * 1e3:6.1f} ms / {base * 1e3:6.1f} ms = {s / base:.2f}"
        costs = action_times(configs[(pp, m, sched)].best()[2])
        if costs:
            f, b, w = costs
            line += f"; F {f:.1f}, B {b:.1f}, W {w:.1f} ms: expected {expected[sched](f, b, w):.2f}"
        print(line)
    failed = [(key, why) for key, c in sorted(configs.items()) for why in c.failed]
    if failed:
        print()
        print("failed runs:")
        for (pp, m, sched), why in failed:
            print(f"  pp {pp}, m {m}, {sched}: {why}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "disturbed":
        disturbed(sys.argv[2], float(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__)
