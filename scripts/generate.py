#!/usr/bin/env python3
"""Generates text from a model `pptrain export` wrote (GPT-2 or Llama), with
transformers' generate().

    generate.py HF_DIR --tokenizer gpt2|bytes|TOKENIZER_JSON [--prompt TEXT]
                [--max-new-tokens N] [--temperature T] [--seed S]

The tokenizer is the one the training data was prepared with (scripts/prepare_data.py).
Temperature 0 is greedy decoding. Needs torch and transformers (scripts/torch_env.sh
makes a venv with both); gpt2 needs tiktoken, a tokenizer.json the tokenizers library.
"""
import argparse
import sys

import torch
from transformers import AutoModelForCausalLM


def codec(spec):
    """(encode(text) -> ids, decode(ids) -> text) of the --tokenizer."""
    if spec == "bytes":
        return (lambda t: list(t.encode("utf-8"))), (lambda ids: bytes(ids).decode("utf-8", "replace"))
    if spec == "gpt2":
        import tiktoken
        enc = tiktoken.get_encoding("gpt2")
        return enc.encode_ordinary, enc.decode
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(spec)
    return (lambda t: tok.encode(t, add_special_tokens=False).ids), tok.decode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="directory written by pptrain export")
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--prompt", default="\n")
    ap.add_argument("--max-new-tokens", type=int, default=200)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    encode, decode = codec(a.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(a.model).eval()  # GPT-2 or Llama
    ids = encode(a.prompt) or [0]
    # The context is the trained sequence length: generation stops there.
    context = getattr(model.config, "n_positions", None) or model.config.max_position_embeddings
    room = context - len(ids)
    if room <= 0:
        sys.exit(f"error: the prompt ({len(ids)} tokens) fills the model's {context}-token context")
    torch.manual_seed(a.seed)
    sample = a.temperature > 0
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=min(a.max_new_tokens, room),
                             do_sample=sample, temperature=a.temperature if sample else None,
                             top_k=0 if sample else None, pad_token_id=0)
    print(decode(out[0].tolist()))


if __name__ == "__main__":
    main()
