#!/usr/bin/env python3
"""Two pptrain binaries on one benchmark shape (scripts/bench.py's), in alternating
pairs: tokens/s of each (median over the steps after the first) and the ratio A / B of
each pair, so that a shared machine's drift weighs on both alike.

Usage: bench_ab.py A B [--shape NAME] [--pairs N] [--steps N] [--threads N]
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--shape", default="GPT-2 124M (T64 B4)")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    opts = ap.parse_args()
    _, config, shape, batch, micro_batches, attention = next(
        s for s in bench.SHAPES if opts.shape in s[0])
    ratios = []
    for _ in range(opts.pairs):
        rates = []
        for binary in (opts.a, opts.b):
            bench.PPTRAIN = binary
            with tempfile.TemporaryDirectory() as work:
                rates.append(bench.run_pptrain(config, shape, batch, micro_batches, attention,
                                               opts.threads, opts.steps, work)["tokens_per_s"])
        ratios.append(rates[0] / rates[1])
        print(f"A {rates[0]:,.1f}  B {rates[1]:,.1f} tokens/s  A/B {ratios[-1]:.3f}", flush=True)
    print(f"{opts.shape}: A/B median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}), {opts.pairs} pairs")


if __name__ == "__main__":
    main()
