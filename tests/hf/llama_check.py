#!/usr/bin/env python3
"""model.arch: llama against transformers' LlamaForCausalLM (eager attention), with
grouped-query attention (4 query heads, 2 key/value heads) and an untied head.

transformers initialises a model and saves it (save_pretrained). For each layout below,
pptrain trains it through checkpoint.init_from for ten AdamW steps, then:
  - its ten logged losses equal ten AdamW steps of transformers' model (float64, the same
    hyper-parameters, weight decay on the 2-D tensors only) to 1e-5 relative; the first
    is the loss of the model transformers saved;
  - `pptrain export` of the final checkpoint is a LlamaForCausalLM directory (config.json
    with model_type llama, num_key_value_heads, rope_theta, rms_norm_eps,
    tie_word_embeddings) whose from_pretrained loss equals `pptrain eval`'s to 1e-5.
The training file holds exactly seq_len + 1 tokens, so every sequence of every step is
that one window whatever the layout's sampling, and the reference needs no sampler.
Then init_from refuses a config.json pptrain cannot honour (exit 2, one line naming the
field). Needs a python with torch and transformers (--torch-python, default
$PPTRAIN_TORCH_PYTHON); exits 0 with a message without one.
Usage: llama_check.py PPTRAIN SOURCE_DIR WORK_DIR [--torch-python PYTHON] [LAYOUT ...]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

# name: (tp, pp, dp, micro_batches, extra overrides).
LAYOUTS = {
    "single": (1, 1, 1, 2, []),
    "tp2_pp2": (2, 2, 1, 2, []),
    "tp2_pp2_dp2_zero1": (2, 2, 2, 1, ["parallel.zero=1"]),
}
MODEL = {"n_layer": 4, "n_head": 4, "n_kv_head": 2, "d_model": 64, "ffn_hidden": 96,
         "seq_len": 32, "vocab_size": 256, "rope_theta": 10000.0, "norm_eps": 1e-5}
HP = {"lr": 2e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
STEPS = 10

# Saves a transformers-initialised LlamaForCausalLM of MODEL's shape to argv[1].
TORCH_INIT = r"""
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
m = json.loads(sys.argv[2])
torch.manual_seed(7)
config = LlamaConfig(vocab_size=m["vocab_size"], hidden_size=m["d_model"],
                     intermediate_size=m["ffn_hidden"], num_hidden_layers=m["n_layer"],
                     num_attention_heads=m["n_head"], num_key_value_heads=m["n_kv_head"],
                     max_position_embeddings=m["seq_len"], rms_norm_eps=m["norm_eps"],
                     rope_theta=m["rope_theta"], tie_word_embeddings=False)
LlamaForCausalLM(config).save_pretrained(sys.argv[1], safe_serialization=True)
"""

# From directory argv[1]: the loss of the window in file argv[2] (mode "eval"), or the
# losses of STEPS AdamW steps on it (mode "train"), one per line; float64 throughout.
TORCH_RUN = r"""
import json, sys, numpy as np, torch
from transformers import LlamaForCausalLM
path, data, mode, hp, steps = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5])
model = LlamaForCausalLM.from_pretrained(path, attn_implementation="eager").double()
tokens = torch.from_numpy(np.frombuffer(open(data, "rb").read(), dtype=np.uint8).astype(np.int64))
T = model.config.max_position_embeddings
w = tokens[: T + 1].reshape(1, T + 1)
def loss_of():
    logits = model(w[:, :-1]).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
if mode == "eval":
    model.eval()
    with torch.no_grad():
        print(f"{loss_of().item():.12f}")
    sys.exit(0)
decay = [p for p in model.parameters() if p.dim() == 2]
no_decay = [p for p in model.parameters() if p.dim() != 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": hp["weight_decay"]},
                         {"params": no_decay, "weight_decay": 0.0}],
                        lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"])
for _ in range(steps):
    opt.zero_grad()
    loss = loss_of()
    loss.backward()
    opt.step()
    print(f"{loss.item():.12f}")
"""


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kw)


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def pptrain_sets(work, data, init_dir, tp, pp, dp, mb, extra):
    sets = [f"model.arch=llama", "model.tie_embeddings=false",
            "data.source=text", f"data.path={data}", f"data.val_path={data}",
            "parallel.micro_batch_size=2", f"parallel.tp={tp}", f"parallel.pp={pp}",
            f"parallel.dp={dp}", f"parallel.micro_batches={mb}", f"train.steps={STEPS}",
            "train.warmup_steps=0", "train.lr_schedule=constant", "train.grad_clip=0",
            "train.eval_every=0", "train.threads=1", "checkpoint.every=0",
            f"checkpoint.dir={work}/ckpt", f"checkpoint.init_from={init_dir}",
            "logging.every=1", f"logging.metrics={work}/metrics.jsonl", "logging.trace="]
    sets += [f"model.{k}={v}" for k, v in MODEL.items()]
    sets += [f"train.{k}={v}" for k, v in HP.items()]
    return sets + extra


def logged_losses(metrics):
    losses = {}
    with open(metrics) as f:
        for line in f:
            rec = json.loads(line)
            if "step" in rec and "loss" in rec:
                losses[rec["step"]] = rec["loss"]
    return [losses[s] for s in sorted(losses)]


def check_layout(name, a, torch_python, data, init_dir, reference_losses):
    tp, pp, dp, mb, extra = LAYOUTS[name]
    work = os.path.join(a.work, name)
    os.makedirs(work)
    base = [a.pptrain, "--config", os.path.join(a.source_dir, "configs", "llama-tiny.yaml")]
    for s in pptrain_sets(work, data, init_dir, tp, pp, dp, mb, extra):
        base += ["--set", s]
    r = run(base)
    if r.returncode != 0:
        return f"train exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    losses = logged_losses(os.path.join(work, "metrics.jsonl"))
    if len(losses) != STEPS:
        return f"{len(losses)} losses logged, expected {STEPS}"
    worst = max(relative(p, t) for p, t in zip(losses, reference_losses))
    problems = []
    if worst > 1e-5:
        problems.append("losses differ from transformers' AdamW steps:\n  pptrain      " +
                        " ".join(f"{x:.7f}" for x in losses) + "\n  transformers " +
                        " ".join(f"{x:.7f}" for x in reference_losses))
    r = run([a.pptrain, "eval"] + base[1:] + ["--set", "checkpoint.resume=auto",
                                              "--set", "checkpoint.init_from="])
    if r.returncode != 0:
        return f"eval exited {r.returncode}\n{r.stdout}\n{r.stderr}"
    eval_loss = float(re.search(r"^val_loss (\S+)$", r.stdout, re.M).group(1))
    out = os.path.join(work, "hf")
    r = run([a.pptrain, "export", "--checkpoint", os.path.join(work, "ckpt"), "--out", out])
    if r.returncode != 0:
        return f"export exited {r.returncode}\n{r.stderr}"
    config = json.load(open(os.path.join(out, "config.json")))
    want = {"model_type": "llama", "num_key_value_heads": MODEL["n_kv_head"],
            "rope_theta": MODEL["rope_theta"], "rms_norm_eps": MODEL["norm_eps"],
            "tie_word_embeddings": False, "intermediate_size": MODEL["ffn_hidden"]}
    for key, value in want.items():
        if config.get(key) != value:
            problems.append(f"config.json {key} is {config.get(key)!r}, expected {value!r}")
    t = run([torch_python, "-c", TORCH_RUN, out, data, "eval", "{}", "0"])
    if t.returncode != 0:
        return f"from_pretrained of the export failed:\n{t.stderr}"
    hf = float(t.stdout.split()[-1])
    if relative(hf, eval_loss) > 1e-5:
        problems.append(f"export: transformers {hf:.9f}, pptrain eval {eval_loss:.9f}")
    print(f"{name:18} 10 steps within {worst:.1e} of transformers; eval {eval_loss:.7f}, "
          f"export in transformers {hf:.7f} -> {'FAIL' if problems else 'ok'}")
    return "\n".join(problems)


def check_refusals(a, data, init_dir):
    """init_from of a config.json pptrain cannot honour: exit 2 naming the field."""
    failures = []
    cases = {"rope_scaling": {"type": "linear", "factor": 2.0}, "hidden_act": "gelu",
             "attention_bias": True, "num_key_value_heads": 4}
    for field, value in cases.items():
        bad = os.path.join(a.work, "refuse_" + field)
        shutil.copytree(init_dir, bad)
        config = json.load(open(os.path.join(bad, "config.json")))
        config[field] = value
        json.dump(config, open(os.path.join(bad, "config.json"), "w"))
        cmd = [a.pptrain, "--config", os.path.join(a.source_dir, "configs", "llama-tiny.yaml")]
        for s in pptrain_sets(bad, data, bad, 1, 1, 1, 1, []):
            cmd += ["--set", s]
        r = run(cmd)
        lines = r.stderr.strip().splitlines()
        ok = r.returncode == 2 and len(lines) == 1 and field in lines[0]
        print(f"refuse {field:20} exit {r.returncode}: {lines[-1] if lines else ''} -> "
              f"{'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append("refuse_" + field)
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pptrain")
    ap.add_argument("source_dir")
    ap.add_argument("work")
    ap.add_argument("layouts", nargs="*", default=list(LAYOUTS))
    ap.add_argument("--torch-python", default=os.environ.get("PPTRAIN_TORCH_PYTHON", ""))
    a = ap.parse_args()
    torch_python = a.torch_python
    if not torch_python or run([torch_python, "-c", "import torch, transformers"]).returncode:
        print("torch and transformers unavailable: skipping the llama checks "
              "(set PPTRAIN_TORCH_PYTHON; scripts/torch_env.sh makes one)")
        return
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    data = os.path.join(a.work, "window.txt")
    with open(os.path.join(a.source_dir, "docs", "config.md"), "rb") as f:
        open(data, "wb").write(f.read()[: MODEL["seq_len"] + 1])
    init_dir = os.path.join(a.work, "init")
    r = run([torch_python, "-c", TORCH_INIT, init_dir, json.dumps(MODEL)])
    if r.returncode != 0:
        sys.exit("transformers could not save the initial model:\n" + r.stderr)
    t = run([torch_python, "-c", TORCH_RUN, init_dir, data, "train", json.dumps(HP), str(STEPS)])
    if t.returncode != 0:
        sys.exit("transformers' AdamW steps failed:\n" + t.stderr)
    reference = [float(x) for x in t.stdout.split()]
    failures = []
    for name in a.layouts:
        problem = check_layout(name, a, torch_python, data, init_dir, reference)
        if problem:
            print(f"{name}: {problem}")
            failures.append(name)
    failures += check_refusals(a, data, init_dir)
    if failures:
        sys.exit("llama checks failed: " + ", ".join(failures))
    print(f"{len(a.layouts) + 4} passed, 0 failed")


if __name__ == "__main__":
    main()
