#!/usr/bin/env python3
"""checkpoint.init_from starts a run from a Hugging Face GPT-2 model in any layout.

Makes GPT-2-shaped random models (vocabulary 50257, 1024 positions, d_model 64, 2
layers) and evaluates each with `pptrain eval --set checkpoint.init_from=...` at
seq_len 32 in tensor- and pipeline-parallel layouts; the loss must equal a reference on
the same windows to 1e-5:
  - gpt2_layout: the original GPT-2 upload's layout (names without "transformer.", the
    attn.bias mask buffers), F32; reference: scripts/hf_reference.py's float64 forward;
  - half: the same in F16 (converted on load); the reference uses the F16 values;
  - transformers: GPT2LMHeadModel(...).save_pretrained(), when a python with torch and
    transformers is given (--torch-python, default $PPTRAIN_TORCH_PYTHON); reference:
    transformers' own loss.
Then fine-tuning: a tp=2 run from init_from saves a checkpoint, and the same command run
again resumes it (resume wins over init_from). Then the refusals: a model of another
depth, another width, and a missing path exit 2 with one line naming the file and tensor.
Usage: init_from_check.py PPTRAIN SOURCE_DIR WORK_DIR [--torch-python PYTHON]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

V, P, C, L, H, T = 50257, 1024, 64, 2, 4, 32
LAYOUTS = {"tp2": (2, 1, 1), "tp2_pp2": (2, 2, 1), "pp2_dp2": (1, 2, 2)}

TORCH_MAKE_AND_EVAL = r"""
import sys, numpy as np, torch
from transformers import GPT2Config, GPT2LMHeadModel
out, data, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.manual_seed(0)
cfg = GPT2Config(vocab_size=50257, n_positions=1024, n_embd=64, n_layer=2, n_head=4,
                 resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
model = GPT2LMHeadModel(cfg).eval()
model.save_pretrained(out, safe_serialization=True)
tokens = np.frombuffer(open(data, "rb").read(), dtype=np.uint8).astype(np.int64)
n = tokens.size // (T + 1)
w = torch.from_numpy(tokens[: n * (T + 1)].reshape(n, T + 1))
model = model.double()
with torch.no_grad():
    logits = model(w[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             w[:, 1:].reshape(-1))
print(f"{loss.item():.12f}")
"""


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


def random_gpt2(seed):
    """GPT-2 parameters under pptrain's names, float64: N(0, 0.02), LayerNorms (1, 0)."""
    rng = np.random.default_rng(seed)
    n = lambda *shape: rng.normal(0.0, 0.02, shape)
    p = {"transformer.wte.weight": n(V, C), "transformer.wpe.weight": n(P, C),
         "transformer.ln_f.weight": 1 + n(C), "transformer.ln_f.bias": n(C)}
    for l in range(L):
        h = f"transformer.h.{l}."
        p.update({h + "ln_1.weight": 1 + n(C), h + "ln_1.bias": n(C),
                  h + "attn.c_attn.weight": n(C, 3 * C), h + "attn.c_attn.bias": n(3 * C),
                  h + "attn.c_proj.weight": n(C, C), h + "attn.c_proj.bias": n(C),
                  h + "ln_2.weight": 1 + n(C), h + "ln_2.bias": n(C),
                  h + "mlp.c_fc.weight": n(C, 4 * C), h + "mlp.c_fc.bias": n(4 * C),
                  h + "mlp.c_proj.weight": n(4 * C, C), h + "mlp.c_proj.bias": n(C)})
    return p


def save_like_gpt2(p, path, dtype):
    """The original upload's layout: no "transformer." prefix, causal-mask buffers."""
    tensors = {k[len("transformer."):]: v.astype(dtype) for k, v in p.items()}
    for l in range(L):
        tensors[f"h.{l}.attn.bias"] = np.tril(np.ones((P, P), np.float32))[None, None]
    os.makedirs(path)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pptrain")
    ap.add_argument("source_dir")
    ap.add_argument("work")
    ap.add_argument("--torch-python", default=os.environ.get("PPTRAIN_TORCH_PYTHON", ""))
    a = ap.parse_args()
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    sys.path.insert(0, os.path.join(a.source_dir, "scripts"))
    import hf_reference  # the independent float64 forward

    data = os.path.join(a.work, "val.txt")  # about 90 windows of 33 bytes
    with open(os.path.join(a.source_dir, "docs", "config.md"), "rb") as f:
        open(data, "wb").write(f.read(3000))
    tokens = hf_reference.read_tokens(data, "text", V)

    models = {}  # name: (dir, reference loss)
    p = random_gpt2(1)
    for name, dtype in (("gpt2_layout", np.float32), ("half", np.float16)):
        path = os.path.join(a.work, name)
        save_like_gpt2(p, path, dtype)
        stored = {k: v.astype(dtype).astype(np.float64) for k, v in p.items()}
        models[name] = (path, hf_reference.mean_loss(stored, tokens, (L, C, V, T), H))
    torch_python = a.torch_python
    if torch_python and run([torch_python, "-c", "import torch, transformers"]).returncode != 0:
        torch_python = ""
    if torch_python:
        path = os.path.join(a.work, "transformers")
        r = run([torch_python, "-c", TORCH_MAKE_AND_EVAL, path, data, str(T)])
        if r.returncode != 0:
            sys.exit(f"transformers could not make its model:\n{r.stderr}")
        models["transformers"] = (path, float(r.stdout.split()[-1]))
    else:
        print("torch and transformers unavailable: skipping the save_pretrained model")

    base = [a.pptrain, "--config", os.path.join(a.source_dir, "configs", "tiny.yaml")]
    for s in ["data.source=text", f"data.path={data}", f"data.val_path={data}",
              f"model.n_layer={L}", f"model.n_head={H}", f"model.d_model={C}",
              f"model.seq_len={T}", f"model.vocab_size={V}", "parallel.micro_batch_size=2",
              "parallel.micro_batches=2", "train.eval_every=0", "train.threads=1",
              "logging.every=1", "logging.metrics=", "logging.trace=", "checkpoint.dir="]:
        base += ["--set", s]

    def layout(tp, pp, dp):
        return ["--set", f"parallel.tp={tp}", "--set", f"parallel.pp={pp}", "--set",
                f"parallel.dp={dp}"]

    failures = []
    for name, (path, want) in models.items():
        for lname, lay in LAYOUTS.items():
            if name != "gpt2_layout" and lname != "tp2":
                continue  # every layout once, every file format once
            r = run([a.pptrain, "eval"] + base[1:] + layout(*lay) +
                    ["--set", f"checkpoint.init_from={path}"])
            got = re.search(r"^val_loss (\S+)$", r.stdout, re.M)
            ok = r.returncode == 0 and got is not None
            rel = abs(float(got.group(1)) - want) / want if ok else float("nan")
            ok = ok and rel <= 1e-5
            note = "wpe: the first 32 of 1024 positions" in r.stderr + r.stdout
            print(f"{name:12} {lname:8} eval {got.group(1) if got else '?'} against {want:.9f} "
                  f"(relative {rel:.1e}){'' if note else ', no wpe note in the log'} -> "
                  f"{'ok' if ok and note else 'FAIL'}")
            if not (ok and note):
                failures.append(f"{name}/{lname}")
                print(r.stdout[-2000:], r.stderr[-2000:])

    # Fine-tuning continues from its own checkpoint once it has one.
    ckpt = os.path.join(a.work, "finetune")
    tune = base + layout(2, 1, 1) + ["--set", f"checkpoint.init_from={models['gpt2_layout'][0]}",
                                     "--set", f"checkpoint.dir={ckpt}", "--set",
                                     "checkpoint.resume=auto", "--set", "train.steps=2"]
    first = run(tune)
    again = run(tune[:-2] + ["--set", "train.steps=3"])
    ok = (first.returncode == 0 and "initialised from" in first.stdout + first.stderr and
          again.returncode == 0 and "resumed from" in again.stdout + again.stderr and
          "initialised from" not in again.stdout + again.stderr)
    print(f"fine-tune: first run initialised from the model, the second resumed -> "
          f"{'ok' if ok else 'FAIL'}")
    if not ok:
        failures.append("finetune")
        print(first.stderr[-2000:], again.stderr[-2000:])

    # Refusals, each one line naming the file and the tensor.
    gpt2 = os.path.join(models["gpt2_layout"][0], "model.safetensors")
    cases = {
        "deeper_model": (["--set", "model.n_layer=3"], "tensor transformer.h.2.ln_1.weight is missing"),
        "shallower_model": (["--set", "model.n_layer=1"], "unexpected tensor h.1."),
        "wider_model": (["--set", "model.d_model=128"], "has shape [50257, 64], the model's is [50257, 128]"),
        "other_vocab": (["--set", "model.vocab_size=50000"], "has shape [50257, 64], the model's is [50000, 64]"),
        "missing_path": (["--set", "checkpoint.init_from=" + os.path.join(a.work, "none")], "no such file"),
    }
    for name, (extra, text) in cases.items():
        r = run([a.pptrain, "eval"] + base[1:] + layout(1, 1, 1) +
                ["--set", f"checkpoint.init_from={gpt2}"] + extra)
        lines = r.stderr.strip().splitlines()
        ok = r.returncode == 2 and len(lines) >= 1 and text in lines[-1] and ".safetensors" in lines[-1] or \
            (name == "missing_path" and r.returncode == 2 and text in (lines[-1] if lines else ""))
        print(f"{name:16} exit {r.returncode}: {lines[-1] if lines else ''} -> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    if failures:
        sys.exit("init_from checks failed: " + ", ".join(failures))
    print("all passed")


if __name__ == "__main__":
    main()
