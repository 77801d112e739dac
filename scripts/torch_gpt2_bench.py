#!/usr/bin/env python3
"""PyTorch GPT-2 training throughput: the baseline pptrain's GPU numbers are set against.

The model is written out here from its definition: token and position embeddings,
pre-LayerNorm blocks (causal scaled_dot_product_attention, GELU with the tanh
approximation), a final LayerNorm and an output head tied to the token embedding; the
vocabulary is padded to a multiple of 128 as pptrain pads it. Training is what pptrain
does on a GPU: fp32 master weights, bf16 autocast, cross-entropy, gradient-norm clip
1.0, fused AdamW (weight decay on matrices only), plus torch.compile: by default of
each block ("regional" compilation: one compiled graph serves every layer, so a deep
model compiles in seconds; --compile model compiles the whole model). Data is random
tokens (never zeros). Shapes come from a pptrain config (model and parallel sections)
or from the options. The first --warmup steps (compilation included) are not timed;
each timed step is measured with CUDA events and the median is reported.

Prints one JSON line: tokens_per_s (median), step_ms, tflops (model FLOPs per second,
pptrain's count: 72*L*C^2 + 6*C*Vp + 12*L*T*C per token), peak_mem_gib and the shape.

With --device cpu it is the CPU baseline of scripts/bench.sh instead: fp32 throughout,
--threads intra-op threads, AdamW without fusion, the causal softmax written out where
PyTorch lacks scaled_dot_product_attention (Debian's 1.13), no compilation; each step is
timed on the host clock.

Usage: torch_gpt2_bench.py --config configs/bench-124m.yaml [--steps 30] [--warmup 5]
       [--batch B] [--seq-len T] [--compile blocks|model|none] [--name NAME]
       [--device cuda|cpu] [--threads N]
Needs PyTorch (with CUDA for the default device); not run in CI.
"""
import argparse
import json
import math
import statistics
import sys
import time


def read_config(path):
    """The scalar keys of a pptrain YAML config as {"section.key": text}.

    Enough for the flat files in configs/: `section:` lines, indented `key: value`
    lines and `section: {key: value, ...}` flow maps; comments are dropped.
    """
    values, section = {}, ""
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            key, _, value = line.strip().partition(":")
            value = value.strip()
            if not line.startswith((" ", "\t")):
                section = key
                if value.startswith("{") and value.endswith("}"):
                    for item in value[1:-1].split(","):
                        k, _, v = item.partition(":")
                        values[f"{section}.{k.strip()}"] = v.strip()
                elif value:
                    values[key] = value
            else:
                values[f"{section}.{key}"] = value
    return values


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", help="pptrain YAML config to take the shapes from")
    p.add_argument("--name", default="", help="label in the JSON line")
    p.add_argument("--n-layer", type=int)
    p.add_argument("--n-head", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--batch", type=int, help="sequences per step (default: the config's "
                   "micro_batch_size * micro_batches)")
    p.add_argument("--micro-batches", type=int, default=1,
                   help="--batch is split into this many micro-batches, their gradients "
                   "accumulated before the optimizer step (as pptrain's parallel.micro_batches)")
    p.add_argument("--steps", type=int, default=30, help="steps in all, warm-up included")
    p.add_argument("--warmup", type=int, default=5, help="first steps not timed")
    p.add_argument("--compile", choices=("blocks", "model", "none"), default="blocks",
                   help="torch.compile each block (default), the whole model, or nothing")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="per-GPU peak for the mfu field (0: no mfu)")
    args = p.parse_args(argv)
    cfg = read_config(args.config) if args.config else {}

    def pick(value, key, default):
        if value is not None:
            return value
        return int(cfg[key]) if key in cfg else default

    args.n_layer = pick(args.n_layer, "model.n_layer", 12)
    args.n_head = pick(args.n_head, "model.n_head", 12)
    args.d_model = pick(args.d_model, "model.d_model", 768)
    args.seq_len = pick(args.seq_len, "model.seq_len", 1024)
    args.vocab_size = pick(args.vocab_size, "model.vocab_size", 50257)
    if args.batch is None:
        args.batch = (pick(None, "parallel.micro_batch_size", 4) *
                      pick(None, "parallel.micro_batches", 1))
    if args.d_model % args.n_head:
        p.error("d_model must be divisible by n_head")
    if args.steps <= args.warmup:
        p.error("--steps must be more than --warmup")
    return args


def flops_per_token(n_layer, d_model, seq_len, padded_vocab):
    """pptrain's gpt_flops_per_token: 6 per parameter use plus attention."""
    L, C, T, V = n_layer, d_model, seq_len, padded_vocab
    return 72.0 * L * C * C + 6.0 * C * V + 12.0 * L * T * C


def build_model(torch, args, padded_vocab):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self, C, n_head):
            super().__init__()
            self.n_head = n_head
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            hs = C // self.n_head
            q = q.view(B, T, self.n_head, hs).transpose(1, 2)
            k = k.view(B, T, self.n_head, hs).transpose(1, 2)
            v = v.view(B, T, self.n_head, hs).transpose(1, 2)
            if hasattr(F, "scaled_dot_product_attention"):
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:  # PyTorch < 2.0
                att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
                y = att.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
            x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            C = args.d_model
            self.wte = nn.Embedding(padded_vocab, C)
            self.wpe = nn.Embedding(args.seq_len, C)
            self.blocks = nn.ModuleList(Block(C, args.n_head) for _ in range(args.n_layer))
            self.ln_f = nn.LayerNorm(C)
            # GPT-2 initialisation; residual projections scaled by 1/sqrt(2 * n_layer).
            for name, prm in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(prm)
                elif prm.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * args.n_layer) if name.endswith(
                        "proj.weight") else 0.02
                    nn.init.normal_(prm, mean=0.0, std=std)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            return F.linear(self.ln_f(x), self.wte.weight)  # head tied to the embedding

    return GPT()


def main(argv):
    args = parse_args(argv)
    import torch  # here, so that --help and py_compile need no PyTorch
    cpu = args.device == "cpu"
    if not cpu and not torch.cuda.is_available():
        print(json.dumps({"name": args.name, "error": "no CUDA device"}))
        return 1
    if cpu and args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    device = torch.device(args.device)
    padded_vocab = (args.vocab_size + 127) // 128 * 128
    model = build_model(torch, args, padded_vocab).to(device)
    padding_rows = (padded_vocab - args.vocab_size) * args.d_model  # not counted
    n_params = sum(p.numel() for p in model.parameters()) - padding_rows
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **({} if cpu else {"fused": True}))
    step_model = model
    if cpu:
        args.compile = "none"
    elif args.compile == "blocks":
        for block in model.blocks:
            block.compile()
    elif args.compile == "model":
        step_model = torch.compile(model)
    F = torch.nn.functional

    def train_step(x, y):
        total = 0.0
        for xm, ym in zip(x.chunk(args.micro_batches), y.chunk(args.micro_batches)):
            if cpu:
                logits = step_model(xm)
            else:
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    logits = step_model(xm)
            loss = F.cross_entropy(logits.float().view(-1, padded_vocab), ym.view(-1))
            (loss / args.micro_batches).backward()
            total = total + loss.detach() / args.micro_batches
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    B, T = args.batch, args.seq_len
    gen = torch.Generator(device=device)
    gen.manual_seed(1)
    batches = []
    for _ in range(4):
        data = torch.randint(0, args.vocab_size, (B, T + 1), device=device, generator=gen)
        batches.append((data[:, :-1].contiguous(), data[:, 1:].contiguous()))
    times_ms, losses = [], []
    for step in range(args.steps):
        x, y = batches[step % len(batches)]
        if cpu:
            t0 = time.perf_counter()
            loss = train_step(x, y)
            if step >= args.warmup:
                times_ms.append((time.perf_counter() - t0) * 1e3)
                losses.append(float(loss))
            continue
        if step == args.warmup:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = train_step(x, y)
        end.record()
        if step >= args.warmup:
            end.synchronize()
            times_ms.append(start.elapsed_time(end))
            losses.append(float(loss))
    if not cpu:
        torch.cuda.synchronize()
    step_ms = statistics.median(times_ms)
    tok_s = B * T / (step_ms / 1e3)
    tflops = flops_per_token(args.n_layer, args.d_model, T, padded_vocab) * tok_s / 1e12
    result = {
        "name": args.name,
        "tokens_per_s": round(tok_s, 1),
        "step_ms": round(step_ms, 3),
        "step_ms_min": round(min(times_ms), 3),
        "step_ms_max": round(max(times_ms), 3),
        "tflops": round(tflops, 2),
        "mfu": round(tflops / args.peak_tflops, 4) if args.peak_tflops > 0 else None,
        "peak_mem_gib": None if cpu else round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "params": n_params,
        "n_layer": args.n_layer, "n_head": args.n_head, "d_model": args.d_model,
        "seq_len": T, "vocab_size": args.vocab_size, "batch": B,
        "micro_batches": args.micro_batches,
        "steps_timed": len(times_ms), "warmup": args.warmup,
        "compile": args.compile, "last_loss": round(losses[-1], 4),
        "device": f"cpu, {torch.get_num_threads()} threads" if cpu else torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
