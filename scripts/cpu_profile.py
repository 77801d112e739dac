#!/usr/bin/env python3
"""Where a CPU training step's time goes: one `perf record` a benchmark shape
(scripts/bench.py's shapes and command lines), its samples summed by what the code does.

Sampling starts after start-up (perf record -D, given per shape) so that the table
describes the steps. Each sample counts for the first category whose pattern matches
its "library symbol"; the GEMM micro-kernels include attention's per-head OpenBLAS
products. Prints one markdown table: a row a category, a column a shape.

Usage: cpu_profile.py [--threads N] [--only NAME ...] [--pptrain BINARY] [--skip SECONDS]
(needs perf; the binary defaults to build/pptrain; --skip replaces every shape's start-up
delay, for hosts that back fresh memory slowly: the kernel row then stays small)
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

# (shape name as in bench.SHAPES, steps, milliseconds of start-up not sampled)
RUNS = [("small (4L d256 T256 B8)", 30, 400),
        ("GPT-2 124M (T64 B4)", 12, 5000),
        ("GPT-2 124M (T1024 B1)", 8, 5000)]

CATEGORIES = [
    ("GEMM micro-kernels", r"avx512_kernel|avx2_kernel|portable_kernel|sgemm_(small_)?kernel"),
    ("GEMM packing and driver", r"pack_|sgemm_\w*copy|sgemm_beta|cpu::gemm|blas_memory|gemm_"),
    ("attention, not its GEMMs", r"attention|blocked_forward|blocked_backward|softmax_row|softmax_backward_row|probability_gradient_row"),
    ("GELU", r"gelu"),
    ("LayerNorm", r"layernorm"),
    ("bias and column sums", r"column_sums|bias"),
    ("embedding", r"embedding"),
    ("cross-entropy", r"cross_entropy|log_softmax|ieee754_(log|exp)|exp_shifted|scale_row|wide_row_max"),
    ("AdamW", r"adamw"),
    ("gradient norm", r"sum_squares"),
    ("memset, memmove", r"memset|memmove|memcpy"),
    ("OpenMP runtime", r"libgomp"),
    ("the kernel (page faults, scheduling)", r"\[kernel"),
    ("other", r""),
]


def profile(args, delay_ms, work):
    data = os.path.join(work, "perf.data")
    subprocess.run(["perf", "record", "-q", "-F", "999", "-D", str(delay_ms), "-o", data, "--"]
                   + args, check=True, stdout=subprocess.DEVNULL)
    report = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                             "--sort", "dso,symbol", "--percent-limit", "0"],
                            capture_output=True, text=True, check=True).stdout
    shares = {name: 0.0 for name, _ in CATEGORIES}
    for line in report.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+(.*)", line)
        if not m:
            continue
        what = m.group(2) + " " + m.group(3)
        for name, pattern in CATEGORIES:
            if re.search(pattern, what):
                shares[name] += float(m.group(1))
                break
    return shares


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--pptrain", default=bench.PPTRAIN)
    ap.add_argument("--skip", type=float, help="seconds of start-up not sampled, every shape")
    opts = ap.parse_args()
    bench.PPTRAIN = opts.pptrain
    shapes = {s[0]: s for s in bench.SHAPES}
    columns = []
    for name, steps, delay_ms in RUNS:
        if opts.only and not any(o in name for o in opts.only):
            continue
        _, config, shape, batch, micro_batches, attention = shapes[name]
        with tempfile.TemporaryDirectory() as work:
            args = bench.pptrain_args(config, shape, batch, micro_batches, attention,
                                      opts.threads, steps, os.path.join(work, "m.jsonl"))
            skip_ms = int(opts.skip * 1000) if opts.skip is not None else delay_ms
            columns.append((f"{name}, {steps} steps", profile(args, skip_ms, work)))
    print(f"perf samples by category, {opts.threads} thread(s), {bench.time.strftime('%Y-%m-%d')}")
    print("| | " + " | ".join(c for c, _ in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for category, _ in CATEGORIES:
        print(f"| {category} | " + " | ".join(f"{s[category]:.1f}%" for _, s in columns) + " |")


if __name__ == "__main__":
    main()
