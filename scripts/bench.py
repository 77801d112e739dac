#!/usr/bin/env python3
"""CPU training benchmark of pptrain, against the sgemm ceiling and PyTorch in the same run.

For each shape (a small model; GPT-2 124M at T=64 and at T=1024), with the attention
that keeps the probabilities (unfused) and, for the small model and T=1024, also the
blocked one (train.attention: fused), it trains a few steps and prints one row: tokens/s and model GFLOP/s (medians over the steps after the first),
that GFLOP/s as a share of the fp32 GEMM ceiling measured at the start of this run
(build/pptrain-sgemm 768x3072x256, same threads), the time from launch to the start of
step 1, the peak resident set, and, when a Python with PyTorch is found, PyTorch's tokens/s for the same model,
threads and batch (scripts/torch_gpt2_bench.py --device cpu) with pptrain's ratio to it.

Usage: bench.py [--threads N] [--steps N] [--only NAME ...]
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

# name, config, (n_layer, n_head, d_model, seq_len, vocab), batch, train.attention
SHAPES = [
    ("small (4L d256 T256 B8)", TINY, (4, 4, 256, 256, 256), 8, "unfused"),
    ("small, blocked attention", TINY, (4, 4, 256, 256, 256), 8, "fused"),
    ("GPT-2 124M (T64 B4)", GPT2, (12, 12, 768, 64, 50257), 4, "unfused"),
    ("GPT-2 124M (T1024 B1)", GPT2, (12, 12, 768, 1024, 50257), 1, "unfused"),
    ("124M T1024, blocked attention", GPT2, (12, 12, 768, 1024, 50257), 1, "fused"),
]


def sgemm_ceiling(threads):
    out = subprocess.run([SGEMM, "768", "3072", "256", str(threads), "3"], capture_output=True,
                         text=True, check=True).stdout
    return float(out.split(":")[1].split()[0])


def run_pptrain(config, shape, batch, attention, threads, steps, work):
    n_layer, n_head, d_model, seq_len, vocab = shape
    metrics = os.path.join(work, "metrics.jsonl")
    sets = [f"model.n_layer={n_layer}", f"model.n_head={n_head}", f"model.d_model={d_model}",
            f"model.seq_len={seq_len}", f"model.vocab_size={vocab}", "parallel.micro_batches=1",
            f"parallel.micro_batch_size={batch}", f"train.steps={steps}",
            f"train.threads={threads}", f"train.attention={attention}", "device=cpu",
            "train.eval_every=0", "train.eval_batches=1",
            "checkpoint.dir=", "logging.every=1", f"logging.metrics={metrics}",
            "logging.level=warn"]
    args = [PPTRAIN, "--config", config]
    for s in sets:
        args += ["--set", s]
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


def run_torch(py, shape, batch, threads, steps):
    n_layer, n_head, d_model, seq_len, vocab = shape
    out = subprocess.run([py, os.path.join(ROOT, "scripts", "torch_gpt2_bench.py"), "--device",
                          "cpu", "--threads", str(threads), "--n-layer", str(n_layer),
                          "--n-head", str(n_head), "--d-model", str(d_model), "--seq-len",
                          str(seq_len), "--vocab-size", str(vocab), "--batch", str(batch),
                          "--steps", str(steps), "--warmup", "1"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])["tokens_per_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    for exe in (PPTRAIN, SGEMM):
        if not os.access(exe, os.X_OK):
            sys.exit(f"build first (scripts/setup.sh): {exe} is missing")
    py = torch_python()
    ceiling = sgemm_ceiling(args.threads)
    print(f"pptrain CPU benchmark: {os.cpu_count()} cores, {args.threads} thread(s), "
          f"{args.steps} steps each (the first not counted), {time.strftime('%Y-%m-%d')}")
    print(f"sgemm ceiling (768x3072x256, {args.threads} threads): {ceiling:.1f} GFLOP/s")
    print("| model | tokens/s | GFLOP/s | share of sgemm | launch to step 1 | peak RSS MiB | "
          "PyTorch tokens/s | pptrain / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    torch_tokens = {}  # by shape: the same model whatever pptrain's attention
    for name, config, shape, batch, attention in SHAPES:
        if args.only and not any(o in name for o in args.only):
            continue
        with tempfile.TemporaryDirectory() as work:
            r = run_pptrain(config, shape, batch, attention, args.threads, args.steps, work)
        if py and (shape, batch) not in torch_tokens:
            torch_tokens[shape, batch] = run_torch(py, shape, batch, args.threads, args.steps)
        torch_tok = torch_tokens.get((shape, batch))
        ratio = f"{r['tokens_per_s'] / torch_tok:.2f}" if torch_tok else "-"
        print(f"| {name} | {r['tokens_per_s']:,.0f} | {r['gflops']:.1f} | "
              f"{r['gflops'] / ceiling:.2f} | {r['first_step_s']:.2f} s | {r['rss_mib']:,.0f} | "
              f"{f'{torch_tok:,.0f}' if torch_tok else '-'} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
