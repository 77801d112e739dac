#!/usr/bin/env python3
"""CPU training benchmark of pptrain, against the sgemm ceiling and PyTorch in the same run.

For each shape (a small model; GPT-2 124M at T=64, with one micro-batch of 4 and with
its config's 8 micro-batches of 4, and at T=1024), with the CPU's default attention (auto:
the blocked kernel) and, for the small model and T=1024, also the one that keeps the
probabilities (unfused), it trains a few steps and prints one row:
- tokens/s and model GFLOP/s (medians over the steps after the first);
- that GFLOP/s as a share of the fp32 GEMM ceiling measured just before the run: the
  faster of OpenBLAS and pptrain's own GEMM (build/pptrain-sgemm 768x3072x256, same
  threads, each library);
- PyTorch's (system) OpenBLAS is given the kernel family pptrain runs
  (OPENBLAS_CORETYPE, unless already set), so both sides' GEMMs are the same kernels;
- the time from launch to the start of step 1 and the peak resident set;
- when a Python with PyTorch is found, PyTorch's tokens/s for the same model, threads,
  batch and micro-batches (scripts/torch_gpt2_bench.py --device cpu), run just after,
  and pptrain's ratio to it.
With --rounds R each row repeats ceiling, pptrain and PyTorch R times in turn and prints
the medians of the rounds' figures and ratios, so that a shared machine's load, which
drifts over minutes, weighs on both sides of each ratio alike.

Usage: bench.py [--threads N] [--steps N] [--rounds R] [--only NAME ...]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PPTRAIN = os.path.join(ROOT, "build", "pptrain")
SGEMM = os.path.join(ROOT, "build", "pptrain-sgemm")
TINY = os.path.join(ROOT, "configs", "tiny.yaml")
GPT2 = os.path.join(ROOT, "configs", "gpt2-124m.yaml")

# name, config, (n_layer, n_head, d_model, seq_len, vocab), micro-batch size,
# micro-batches per step, train.attention
SHAPES = [
    ("small (4L d256 T256 B8)", TINY, (4, 4, 256, 256, 256), 8, 1, "auto"),
    ("small, unfused attention", TINY, (4, 4, 256, 256, 256), 8, 1, "unfused"),
    ("GPT-2 124M (T64 B4)", GPT2, (12, 12, 768, 64, 50257), 4, 1, "auto"),
    ("GPT-2 124M (T64, 8 micro-batches of 4)", GPT2, (12, 12, 768, 64, 50257), 4, 8, "auto"),
    ("GPT-2 124M (T1024 B1)", GPT2, (12, 12, 768, 1024, 50257), 1, 1, "auto"),
    ("124M T1024, unfused attention", GPT2, (12, 12, 768, 1024, 50257), 1, 1, "unfused"),
]


def sgemm_ceiling(threads):
    """GFLOP/s (the faster library), and the OpenBLAS kernel family pptrain runs."""
    rates, family = [], None
    for library in ("openblas", "pptrain"):
        out = subprocess.run([SGEMM, "768", "3072", "256", str(threads), "2", library],
                             capture_output=True, text=True, check=True).stdout
        rates.append(float(out.split(":")[1].split()[0]))
        if library == "openblas":
            family = out.split("(OpenBLAS ")[1].split(")")[0]
    return max(rates), family


def pptrain_args(config, shape, batch, micro_batches, attention, threads, steps, metrics):
    """The command line that trains one shape, logging every step to `metrics`."""
    n_layer, n_head, d_model, seq_len, vocab = shape
    sets = [f"model.n_layer={n_layer}", f"model.n_head={n_head}", f"model.d_model={d_model}",
            f"model.seq_len={seq_len}", f"model.vocab_size={vocab}",
            f"parallel.micro_batches={micro_batches}",
            f"parallel.micro_batch_size={batch}", f"train.steps={steps}",
            f"train.threads={threads}", f"train.attention={attention}", "device=cpu",
            "train.eval_every=0", "train.eval_batches=1",
            "checkpoint.dir=", "logging.every=1", f"logging.metrics={metrics}",
            "logging.level=warn"]
    args = [PPTRAIN, "--config", config]
    for s in sets:
        args += ["--set", s]
    return args


def run_pptrain(config, shape, batch, micro_batches, attention, threads, steps, work):
    metrics = os.path.join(work, "metrics.jsonl")
    args = pptrain_args(config, shape, batch, micro_batches, attention, threads, steps, metrics)
    start = time.monotonic()
    proc = subprocess.Popen(args)
    first_line_at = None
    while proc.poll() is None:
        if first_line_at is None and os.path.exists(metrics) and os.path.getsize(metrics) > 0:
            first_line_at = time.monotonic() - start
        time.sleep(0.01)
    if proc.returncode != 0:
        sys.exit(f"pptrain exited {proc.returncode}")
    rows = [json.loads(l) for l in open(metrics)]
    if first_line_at is None:
        first_line_at = time.monotonic() - start
    timed = rows[1:] or rows
    return {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in timed),
            "gflops": 1e3 * statistics.median(r["tflops_per_rank"] for r in timed),
            "rss_mib": max(r["peak_rss_mib"] for r in rows),
            # The first record is written when step 1 ends; step 1 began step_time_s earlier.
            "first_step_s": first_line_at - rows[0]["step_time_s"]}


def torch_python():
    for py in ("python3", "/usr/bin/python3"):
        if shutil.which(py) and subprocess.run([py, "-c", "import torch"],
                                               capture_output=True).returncode == 0:
            return py
    return None


def run_torch(py, shape, batch, micro_batches, threads, steps):
    n_layer, n_head, d_model, seq_len, vocab = shape
    out = subprocess.run([py, os.path.join(ROOT, "scripts", "torch_gpt2_bench.py"), "--device",
                          "cpu", "--threads", str(threads), "--n-layer", str(n_layer),
                          "--n-head", str(n_head), "--d-model", str(d_model), "--seq-len",
                          str(seq_len), "--vocab-size", str(vocab), "--batch",
                          str(batch * micro_batches), "--micro-batches", str(micro_batches),
                          "--steps", str(steps), "--warmup", "1"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])["tokens_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    for exe in (PPTRAIN, SGEMM):
        if not os.access(exe, os.X_OK):
            sys.exit(f"build first (scripts/setup.sh): {exe} is missing")
    py = torch_python()
    print(f"pptrain CPU benchmark: {os.cpu_count()} cores, {args.threads} thread(s), "
          f"{args.steps} steps each (the first not counted), {args.rounds} round(s), "
          f"{time.strftime('%Y-%m-%d')}")
    print("| model | tokens/s | GFLOP/s | sgemm ceiling | share of sgemm | launch to step 1 | "
          "peak RSS MiB | PyTorch tokens/s | pptrain / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    med = statistics.median
    for name, config, shape, batch, micro_batches, attention in SHAPES:
        if args.only and not any(o in name for o in args.only):
            continue
        rounds = []
        for _ in range(args.rounds):
            ceiling, family = sgemm_ceiling(args.threads)
            # PyTorch's OpenBLAS runs the same kernels, unless the user chose them.
            os.environ.setdefault("OPENBLAS_CORETYPE", family)
            with tempfile.TemporaryDirectory() as work:
                r = run_pptrain(config, shape, batch, micro_batches, attention, args.threads,
                                args.steps, work)
            r["ceiling"] = ceiling
            if py:
                r["torch"] = run_torch(py, shape, batch, micro_batches, args.threads, args.steps)
            rounds.append(r)
        torch_cols = "- | -"
        if py:
            torch_cols = (f"{med(r['torch'] for r in rounds):,.0f} | "
                          f"{med(r['tokens_per_s'] / r['torch'] for r in rounds):.2f}")
        print(f"| {name} | {med(r['tokens_per_s'] for r in rounds):,.0f} | "
              f"{med(r['gflops'] for r in rounds):.1f} | {med(r['ceiling'] for r in rounds):.1f} | "
              f"{med(r['gflops'] / r['ceiling'] for r in rounds):.2f} | "
              f"{med(r['first_step_s'] for r in rounds):.2f} s | "
              f"{max(r['rss_mib'] for r in rounds):,.0f} | {torch_cols} |", flush=True)


if __name__ == "__main__":
    main()
