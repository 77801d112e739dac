#!/usr/bin/env python3
"""Tests of scripts/hf_reference.py itself, on random GPT-2 weights it did not write:
it accepts a well-formed file, rejects each kind of malformed one with exit status 1
and a message naming the problem, its forward pass is causal and gives ln(V) when the
logits are all zero, and it reads llm.c shards.

    check_reference.py SOURCE_DIR WORK_DIR
"""
import importlib.util
import math
import os
import shutil
import subprocess
import sys

import numpy as np
from safetensors.numpy import save_file

SRC, WORK = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(SRC, "scripts", "hf_reference.py")
spec = importlib.util.spec_from_file_location("hf_reference", SCRIPT)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)

N_LAYER, C, V, T, N_HEAD = 2, 16, 50, 8, 2
failures = []


def expect(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def random_weights(seed=0):
    rng = np.random.default_rng(seed)
    shapes = ref.expected_shapes(N_LAYER, C, V, T)
    return {k: rng.normal(0, 0.3, s).astype(np.float32) for k, s in shapes.items()}


def run(tensors, name, metadata=None):
    path = os.path.join(WORK, name + ".safetensors")
    save_file(tensors, path, metadata={"format": "pt"} if metadata is None else metadata)
    p = subprocess.run([sys.executable, SCRIPT, path, "--n-head", str(N_HEAD), "--data", data],
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


shutil.rmtree(WORK, ignore_errors=True)
os.makedirs(WORK)
data = os.path.join(WORK, "tokens.bin")
rng = np.random.default_rng(1)
rng.integers(0, V, 5 * (T + 1) + 3).astype("<u2").tofile(data)

good = random_weights()
rc, out = run(good, "good")
expect(rc == 0 and "val_loss" in out, f"accepts well-formed GPT-2 weights (rc {rc})")


def rejects(what, tensors, message, metadata=None):
    rc, out = run(tensors, what.replace(" ", "_"), metadata)
    expect(rc == 1 and message in out, f"rejects {what} (rc {rc}): {out.strip()[-150:]}")


rejects("missing tensor", {k: v for k, v in good.items() if k != "transformer.h.1.mlp.c_fc.bias"},
        "missing GPT-2 tensor transformer.h.1.mlp.c_fc.bias")
rejects("extra tensor", {**good, "lm_head.weight": good["transformer.wte.weight"].copy()},
        "unexpected tensor lm_head.weight")
rejects("transposed Conv1D weight",
        {**good, "transformer.h.0.attn.c_attn.weight":
            np.ascontiguousarray(good["transformer.h.0.attn.c_attn.weight"].T)},
        "transformer.h.0.attn.c_attn.weight has shape [48, 16]")
rejects("F16 tensor", {**good, "transformer.ln_f.bias": good["transformer.ln_f.bias"].astype(
    np.float16)}, "dtype F16")
rejects("missing format metadata", good, "format", metadata={})
renamed = {k.replace("transformer.h.1.", "transformer.h.2."): v for k, v in good.items()}
rejects("layer numbering gap", renamed, "missing GPT-2 tensor transformer.h.1.")
bad = dict(good)
bad["transformer.wpe.weight"] = good["transformer.wpe.weight"].copy()
bad["transformer.wpe.weight"][1, 2] = np.nan
rejects("non-finite value", bad, "non-finite")

# The forward pass: position t's logits must not depend on tokens after t.
p64 = {k: v.astype(np.float64) for k, v in good.items()}
ids = rng.integers(0, V, (1, T))
changed = ids.copy()
changed[0, 5:] = (changed[0, 5:] + 1) % V
a, b = ref.logits(p64, ids, N_LAYER, N_HEAD), ref.logits(p64, changed, N_LAYER, N_HEAD)
expect(np.array_equal(a[0, :5], b[0, :5]) and not np.allclose(a[0, 5:], b[0, 5:]),
       "attention is causal")
# A zero embedding table gives zero logits through the tied head: loss ln(V).
p64["transformer.wte.weight"] = np.zeros((V, C))
tokens = ref.read_tokens(data, "nanogpt", V)
loss = ref.mean_loss(p64, tokens, (N_LAYER, C, V, T), N_HEAD)
expect(abs(loss - math.log(V)) < 1e-12, f"zero logits give ln(V) (got {loss!r})")

# An llm.c shard (1 KiB int32 header: magic, version, count) holds the same tokens.
shard = os.path.join(WORK, "tokens.llmc")
header = np.zeros(256, dtype="<i4")
header[:3] = [20240520, 1, tokens.size]
with open(shard, "wb") as f:
    f.write(header.tobytes() + tokens.astype("<u2").tobytes())
expect(np.array_equal(ref.read_tokens(shard, "llmc", V), tokens), "reads llm.c shards")

sys.exit(1 if failures else 0)
