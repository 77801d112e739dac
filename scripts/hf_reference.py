#!/usr/bin/env python3
"""Independent check that a pptrain checkpoint is a Hugging Face GPT-2 model.

Reads <checkpoint>/model.safetensors, checks that it holds exactly GPT-2's tensors
(Hugging Face names and shapes, F32, nothing else, metadata format "pt"), runs GPT-2's
forward pass in float64 with numpy (written from the model's definition, independent of
pptrain's code) and prints the mean next-token cross-entropy over a token file cut into consecutive,
non-overlapping windows of seq_len+1 tokens (a last partial window is dropped) -- the
windows `pptrain eval` uses.

    hf_reference.py CHECKPOINT_DIR --n-head H --data FILE [--format text|llmc|nanogpt]
                    [--compare LOSS ... --rtol R]

Prints `val_loss X`. Each --compare LOSS (repeatable) passes when
|X - LOSS| <= R * |LOSS| + u / 2, where u is one unit in LOSS's last written digit
(LOSS was printed rounded: "3.560297" has u = 1e-6; a full-precision value has u ~ 0).
Exit status: 0 fine; 1 the checkpoint or token file is not valid (one line says why);
3 a --compare failed.
Needs python3 with numpy and safetensors (pip install numpy safetensors).
"""
import argparse
import decimal
import json
import math
import os
import re
import struct
import sys

import numpy as np
from safetensors.numpy import load_file

LN_EPS = 1e-5
LLMC_MAGIC, LLMC_VERSION, LLMC_HEADER_INTS = 20240520, 1, 256
LAYER_PARTS = ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"]


class Invalid(Exception):
    """A checkpoint or token file that is not what it should be."""


def read_header(path):
    """The JSON header of a safetensors file: {name: {dtype, shape, data_offsets}}."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise Invalid(f"{path}: too short for a safetensors file")
            (n,) = struct.unpack("<Q", raw)
            if n > os.path.getsize(path) - 8:
                raise Invalid(f"{path}: header length {n} runs past the end of the file")
            header = json.loads(f.read(n))
    except OSError as e:
        raise Invalid(f"{path}: cannot read: {e.strerror}") from None
    except (ValueError, UnicodeDecodeError):
        raise Invalid(f"{path}: safetensors header is not valid JSON") from None
    if not isinstance(header, dict) or not all(isinstance(v, dict) for v in header.values()):
        raise Invalid(f"{path}: safetensors header is not a map of tensor entries")
    # transformers refuses a safetensors file whose metadata lacks a known "format".
    metadata = header.pop("__metadata__", None) or {}
    if metadata.get("format") != "pt":
        raise Invalid(f"{path}: __metadata__ format is {metadata.get('format')!r}, expected 'pt'")
    return header


def expected_shapes(n_layer, d_model, vocab, seq_len):
    """GPT-2's tensors by Hugging Face name; Conv1D weights are (in, out)."""
    C = d_model
    shapes = {"transformer.wte.weight": [vocab, C], "transformer.wpe.weight": [seq_len, C]}
    for l in range(n_layer):
        h = f"transformer.h.{l}."
        shapes.update({
            h + "ln_1.weight": [C], h + "ln_1.bias": [C],
            h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
            h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
            h + "ln_2.weight": [C], h + "ln_2.bias": [C],
            h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
            h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C],
        })
    shapes["transformer.ln_f.weight"] = [C]
    shapes["transformer.ln_f.bias"] = [C]
    return shapes


def check_checkpoint(path, n_head):
    """Validates the header; returns (tensors, dims) with dims = n_layer, C, V, T."""
    header = read_header(path)
    for key in ("transformer.wte.weight", "transformer.wpe.weight"):
        if key not in header or len(header[key].get("shape", [])) != 2:
            raise Invalid(f"{path}: no 2-D tensor {key}")
    vocab, d_model = header["transformer.wte.weight"]["shape"]
    seq_len = header["transformer.wpe.weight"]["shape"][0]
    layers = {int(m.group(1)) for k in header
              if (m := re.fullmatch(r"transformer\.h\.(\d+)\..*", k))}
    n_layer = max(layers) + 1 if layers else 0
    if n_layer == 0:
        raise Invalid(f"{path}: no transformer.h.N tensors")
    if n_layer > len(header):  # a stray huge index: the blocks cannot all be there
        raise Invalid(f"{path}: block transformer.h.{n_layer - 1} but only {len(header)} tensors")
    want = expected_shapes(n_layer, d_model, vocab, seq_len)
    missing = sorted(set(want) - set(header))
    extra = sorted(set(header) - set(want))
    if missing:
        raise Invalid(f"{path}: missing GPT-2 tensor {missing[0]} ({len(missing)} missing)")
    if extra:
        raise Invalid(f"{path}: unexpected tensor {extra[0]} ({len(extra)} not in GPT-2)")
    for name, shape in want.items():
        info = header[name]
        if info.get("dtype") != "F32":
            raise Invalid(f"{path}: {name} has dtype {info.get('dtype')}, expected F32")
        if list(info.get("shape", [])) != shape:
            raise Invalid(f"{path}: {name} has shape {info.get('shape')}, expected {shape}")
    if n_head < 1 or d_model % n_head != 0:
        raise Invalid(f"{path}: d_model {d_model} is not divisible by --n-head {n_head}")
    try:
        tensors = load_file(path)
    except Exception as e:  # the library's own message says what is wrong
        raise Invalid(f"{path}: safetensors cannot load it: {e}") from None
    for name, t in tensors.items():
        if t.dtype != np.float32 or list(t.shape) != want[name]:
            raise Invalid(f"{path}: {name} loads as {t.dtype} {list(t.shape)}")
        if not np.all(np.isfinite(t)):
            raise Invalid(f"{path}: {name} holds non-finite values")
    return {k: v.astype(np.float64) for k, v in tensors.items()}, (n_layer, d_model, vocab,
                                                                   seq_len)


def read_tokens(path, fmt, vocab):
    """Whole token file as int64: text bytes, llm.c shard or raw nanoGPT uint16."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise Invalid(f"{path}: cannot read: {e.strerror}") from None
    if fmt == "text":
        tokens = np.frombuffer(raw, dtype=np.uint8)
    elif fmt == "nanogpt":
        if len(raw) % 2:
            raise Invalid(f"{path}: odd size {len(raw)} for uint16 tokens")
        tokens = np.frombuffer(raw, dtype="<u2")
    else:
        head = LLMC_HEADER_INTS * 4
        if len(raw) < head:
            raise Invalid(f"{path}: shorter than an llm.c header ({head} bytes)")
        magic, version, count = struct.unpack("<3i", raw[:12])
        if magic != LLMC_MAGIC or version != LLMC_VERSION:
            raise Invalid(f"{path}: not an llm.c v1 shard (magic {magic}, version {version})")
        if count < 0 or len(raw) != head + 2 * count:
            raise Invalid(f"{path}: header declares {count} tokens, file has {len(raw)} bytes")
        tokens = np.frombuffer(raw, dtype="<u2", offset=head)
    tokens = tokens.astype(np.int64)
    if tokens.size and tokens.max() >= vocab:
        raise Invalid(f"{path}: token {tokens.max()} >= vocabulary {vocab} of the checkpoint")
    return tokens


def layer_norm(x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased, as torch's LayerNorm
    return (x - mean) / np.sqrt(var + LN_EPS) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def conv1d(x, p, name):
    """GPT-2's Conv1D: y = x @ W + b with W stored (in, out)."""
    return x @ p[name + ".weight"] + p[name + ".bias"]


def attention(x, p, h, n_head):
    B, T, C = x.shape
    hd = C // n_head
    q, k, v = np.split(conv1d(x, p, h + "attn.c_attn"), 3, axis=-1)
    heads = lambda t: t.reshape(B, T, n_head, hd).transpose(0, 2, 1, 3)  # (B, H, T, hd)
    q, k, v = heads(q), heads(k), heads(v)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    scores = np.where(future, -np.inf, scores)
    scores -= scores.max(axis=-1, keepdims=True)
    att = np.exp(scores)
    att /= att.sum(axis=-1, keepdims=True)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return conv1d(y, p, h + "attn.c_proj")


def logits(p, inputs, n_layer, n_head):
    """GPT2LMHeadModel's forward without dropout: (B, T) ids -> (B, T, V) logits."""
    T = inputs.shape[1]
    x = p["transformer.wte.weight"][inputs] + p["transformer.wpe.weight"][:T]
    for l in range(n_layer):
        h = f"transformer.h.{l}."
        x = x + attention(layer_norm(x, p[h + "ln_1.weight"], p[h + "ln_1.bias"]), p, h, n_head)
        m = layer_norm(x, p[h + "ln_2.weight"], p[h + "ln_2.bias"])
        x = x + conv1d(gelu_tanh(conv1d(m, p, h + "mlp.c_fc")), p, h + "mlp.c_proj")
    x = layer_norm(x, p["transformer.ln_f.weight"], p["transformer.ln_f.bias"])
    return x @ p["transformer.wte.weight"].T  # tied LM head


def mean_loss(p, tokens, dims, n_head, batch=16):
    n_layer, _, _, T = dims
    windows = tokens.size // (T + 1)
    if windows == 0:
        raise Invalid(f"token file holds {tokens.size} tokens, fewer than seq_len+1 = {T + 1}")
    w = tokens[: windows * (T + 1)].reshape(windows, T + 1)
    total = 0.0
    for first in range(0, windows, batch):
        chunk = w[first:first + batch]
        z = logits(p, chunk[:, :-1], n_layer, n_head)
        zmax = z.max(axis=-1, keepdims=True)
        logsumexp = (zmax + np.log(np.exp(z - zmax).sum(axis=-1, keepdims=True)))[..., 0]
        target = np.take_along_axis(z, chunk[:, 1:, None], axis=-1)[..., 0]
        total += float((logsumexp - target).sum())
    return total / (windows * T)


def decimal_arg(text):
    """A finite number, kept as written so its rounding is known."""
    try:
        d = decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not d.is_finite():
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="step dir holding model.safetensors, or the file")
    ap.add_argument("--n-head", type=int, required=True, help="attention heads per block")
    ap.add_argument("--data", required=True, help="token file to evaluate on")
    ap.add_argument("--format", choices=["text", "llmc", "nanogpt"], default="text")
    ap.add_argument("--compare", action="append", default=[], type=decimal_arg,
                    help="expected loss as printed (e.g. by pptrain eval); repeatable")
    ap.add_argument("--rtol", type=float, default=1e-7, help="relative tolerance of --compare")
    args = ap.parse_args()
    path = args.checkpoint
    if os.path.isdir(path):
        path = os.path.join(path, "model.safetensors")
    try:
        params, dims = check_checkpoint(path, args.n_head)
        n_layer, d_model, vocab, seq_len = dims
        print(f"checkpoint {path}: GPT-2 with n_layer {n_layer}, n_head {args.n_head}, "
              f"d_model {d_model}, vocab {vocab}, seq_len {seq_len}")
        loss = mean_loss(params, read_tokens(args.data, args.format, vocab), dims, args.n_head)
    except Invalid as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"val_loss {loss:.12f}")
    status = 0
    for text in args.compare:
        want = float(text)
        half_unit = 0.5 * 10.0 ** text.as_tuple().exponent  # rounding of the printed value
        diff = abs(loss - want)
        rel = diff / abs(want) if want else math.inf
        ok = math.isfinite(loss) and diff <= args.rtol * abs(want) + half_unit
        print(f"compare {text}: |diff| {diff:.3e}, relative {rel:.3e}, allowed "
              f"rtol {args.rtol:g} + rounding {half_unit:.1e}: {'ok' if ok else 'FAIL'}")
        if not ok:
            print(f"error: loss {loss:.12f} differs from {text} beyond the tolerance",
                  file=sys.stderr)
            status = 3
    return status


if __name__ == "__main__":
    sys.exit(main())
