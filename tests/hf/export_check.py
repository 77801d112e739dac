#!/usr/bin/env python3
"""`pptrain export` turns checkpoints of any layout (the one-rank file, sharded ones) into a
Hugging Face GPT-2 directory.

For each layout below: trains a tiny model on a text file (vocabulary 300, so the
exported wte keeps only the real rows of the padded one), takes `pptrain eval`'s loss of
the checkpoint, exports it, and checks the directory:
  - scripts/hf_reference.py (an independent float64 GPT-2 in numpy) finds exactly
    GPT-2's tensors and the same loss to 1e-7;
  - GPT2LMHeadModel.from_pretrained (transformers) gives the same loss to 1e-5, when a
    python with torch and transformers is given (--torch-python, default
    $PPTRAIN_TORCH_PYTHON: scripts/torch_env.sh makes one), else that part is skipped
    with a message.
Then the refusals: an --out that is not empty and a directory that is not a checkpoint
exit 2 and leave nothing behind.
Usage: export_check.py PPTRAIN SOURCE_DIR WORK_DIR [--torch-python PYTHON]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

# name: (tp, pp, dp, micro_batches, extra overrides).
LAYOUTS = {
    "single": (1, 1, 1, 2, []),
    "tp2_pp2": (2, 2, 1, 2, []),
    "pp2_dp2_zero1": (1, 2, 2, 1, ["parallel.zero=1"]),
    "tp2_sp": (2, 1, 1, 2, ["parallel.sequence_parallel=true"]),
}
N_HEAD = 4

# transformers' loss over the windows pptrain eval uses: consecutive, non-overlapping
# windows of seq_len+1 tokens of the file's bytes, a last partial window dropped.
TORCH_EVAL = r"""
import sys, numpy as np, torch
from transformers import GPT2LMHeadModel
model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).double().eval()
T = model.config.n_positions
tokens = np.frombuffer(open(sys.argv[2], "rb").read(), dtype=np.uint8).astype(np.int64)
n = tokens.size // (T + 1)
w = torch.from_numpy(tokens[: n * (T + 1)].reshape(n, T + 1))
with torch.no_grad():
    logits = model(w[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             w[:, 1:].reshape(-1), reduction="mean")
print(f"{loss.item():.12f}")
"""


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pptrain")
    ap.add_argument("source_dir")
    ap.add_argument("work")
    ap.add_argument("--torch-python", default=os.environ.get("PPTRAIN_TORCH_PYTHON", ""))
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    data = os.path.join(a.source_dir, "docs", "config.md")
    reference = os.path.join(a.source_dir, "scripts", "hf_reference.py")
    torch_python = a.torch_python
    if torch_python and run([torch_python, "-c", "import torch, transformers"]).returncode != 0:
        torch_python = ""
    if not torch_python:
        print("torch and transformers unavailable: skipping the from_pretrained check "
              "(the numpy reference still runs)")
    failures = []
    for name, (tp, pp, dp, mb, extra) in LAYOUTS.items():
        ckpt = os.path.join(a.work, name, "ckpt")
        out = os.path.join(a.work, name, "hf")
        sets = ["data.source=text", f"data.path={data}", f"data.val_path={data}",
                "model.n_layer=4", f"model.n_head={N_HEAD}", "model.d_model=64",
                "model.seq_len=32", "model.vocab_size=300", "parallel.micro_batch_size=4",
                f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
                f"parallel.micro_batches={mb}", "train.steps=20", "train.eval_every=0",
                "train.threads=1", "checkpoint.every=0", f"checkpoint.dir={ckpt}",
                "logging.every=10", "logging.metrics=", "logging.trace="] + extra
        base = [a.pptrain, "--config", os.path.join(a.source_dir, "configs", "tiny.yaml")]
        for s in sets:
            base += ["--set", s]
        for step in (base, [base[0], "eval"] + base[1:] + ["--set", "checkpoint.resume=auto"]):
            r = run(step)
            if r.returncode != 0:
                sys.exit(f"{name}: {' '.join(step[:2])} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
        eval_loss = re.search(r"^val_loss (\S+)$", r.stdout, re.M).group(1)
        r = run([a.pptrain, "export", "--checkpoint", ckpt, "--out", out])
        if r.returncode != 0:
            sys.exit(f"{name}: export exited {r.returncode}\n{r.stderr}")
        ok = sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
        r = run([sys.executable, reference, out, "--n-head", str(N_HEAD), "--data", data,
                 "--format", "text", "--compare", eval_loss, "--rtol", "1e-7"])
        ok = ok and r.returncode == 0
        line = f"{name:14} eval {eval_loss}, numpy reference {'ok' if r.returncode == 0 else 'FAIL'}"
        if r.returncode != 0:
            line += "\n" + r.stdout + r.stderr
        if torch_python:
            t = run([torch_python, "-c", TORCH_EVAL, out, data])
            if t.returncode != 0:
                ok = False
                line += f", transformers FAILED:\n{t.stderr}"
            else:
                hf = float(t.stdout.split()[-1])
                rel = abs(hf - float(eval_loss)) / float(eval_loss)
                ok = ok and rel <= 1e-5
                line += f", transformers {hf:.9f} (relative {rel:.1e})"
        print(line + f" -> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    # Refusals: a non-empty --out, a directory that is not a checkpoint.
    first = os.path.join(a.work, next(iter(LAYOUTS)))
    cases = {
        "nonempty_out": ["--checkpoint", os.path.join(first, "ckpt"), "--out", os.path.join(first, "hf")],
        "not_a_checkpoint": ["--checkpoint", a.work, "--out", os.path.join(a.work, "never")],
    }
    for name, args in cases.items():
        r = run([a.pptrain, "export"] + args)
        lines = r.stderr.strip().splitlines()
        ok = r.returncode == 2 and len(lines) == 1 and not os.path.exists(os.path.join(a.work, "never"))
        print(f"{name:14} exit {r.returncode}: {lines[-1] if lines else ''} -> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    if failures:
        sys.exit("export checks failed: " + ", ".join(failures))
    print(f"{len(LAYOUTS) + len(cases)} passed, 0 failed")


if __name__ == "__main__":
    main()
