#!/usr/bin/env python3
"""Tokenizes text files into llm.c token shards for pptrain (data.source: llmc).

    prepare_data.py INPUT... --out DIR --tokenizer gpt2|bytes|TOKENIZER_JSON
                    [--gpt2-ranks FILE] [--val-fraction F] [--shard-tokens N] [--name NAME]

Each INPUT is one document (a text file, read as UTF-8; bytes for --tokenizer bytes).
Writes DIR/NAME_val_000000.bin ... and DIR/NAME_train_000000.bin ...: llm.c's format, a
header of 256 little-endian int32 (magic 20240520, version 1, token count) then that
many uint16 tokens, at most N tokens a shard (default 100,000,000, as llm.c). The first
F of the tokens (default 0.1; 0 for none) are the validation split. NAME defaults to
DIR's name. Train on them with
    --set data.source=llmc --set "data.path=DIR/NAME_train_*.bin"
    --set "data.val_path=DIR/NAME_val_*.bin" --set model.vocab_size=V
with V the vocabulary size this script prints.

Tokenizers: `gpt2` is tiktoken's GPT-2 BPE (pip install tiktoken), with <|endoftext|>
(50256) before each document, as llm.c's scripts do. tiktoken downloads its byte-pair
ranks on first use; offline, --gpt2-ranks names a copy in tiktoken's format (base64
token, rank; PyPI's openai-whisper source distribution ships one as
whisper/assets/gpt2.tiktoken); a path to a Hugging Face tokenizer.json uses the `tokenizers` library
(pip install tokenizers); `bytes` makes one token per byte (vocabulary 256).
"""
import argparse
import os
import struct
import sys
from array import array

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256


# GPT-2's pre-tokenizer pattern and end-of-text token, as GPT-2's encoder.py defines them.
GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                r"""|\s+(?!\S)|\s+""")
GPT2_END_OF_TEXT = 50256


def gpt2_encoding(ranks_file):
    """tiktoken's GPT-2 encoding: its own (downloaded once), or built from a ranks file."""
    try:
        import tiktoken
        import tiktoken.load
    except ImportError:
        sys.exit("error: --tokenizer gpt2 needs tiktoken (pip install tiktoken)")
    if not ranks_file:
        return tiktoken.get_encoding("gpt2")
    try:
        ranks = tiktoken.load.load_tiktoken_bpe(ranks_file)
    except (OSError, ValueError) as e:
        sys.exit(f"error: --gpt2-ranks {ranks_file}: not a tiktoken ranks file ({e})")
    if len(ranks) != GPT2_END_OF_TEXT or sorted(ranks.values()) != list(range(GPT2_END_OF_TEXT)):
        sys.exit(f"error: --gpt2-ranks {ranks_file}: holds {len(ranks)} ranks, not GPT-2's "
                 f"{GPT2_END_OF_TEXT} (0 to {GPT2_END_OF_TEXT - 1})")
    return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": GPT2_END_OF_TEXT})


def make_tokenizer(spec, gpt2_ranks=None):
    """(encode -> list of ids, vocabulary size, ids put before each document, whether
    encode takes the file's bytes rather than its text)."""
    if gpt2_ranks and spec != "gpt2":
        sys.exit("error: --gpt2-ranks is for --tokenizer gpt2")
    if spec == "bytes":
        return (lambda data: list(data)), 256, [], True
    if spec == "gpt2":
        enc = gpt2_encoding(gpt2_ranks)
        eot = enc.eot_token
        return (lambda text: enc.encode_ordinary(text)), enc.n_vocab, [eot], False
    if not os.path.isfile(spec):
        sys.exit(f"error: --tokenizer {spec}: not gpt2, bytes or a tokenizer.json file")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("error: a tokenizer.json needs the tokenizers library (pip install tokenizers)")
    tok = Tokenizer.from_file(spec)
    return (lambda text: tok.encode(text, add_special_tokens=False).ids), tok.get_vocab_size(), [], False


class Progress:
    """A one-line progress bar on stderr: bytes read of the inputs, tokens made."""

    def __init__(self, total_bytes):
        self.total, self.done, self.tokens = max(total_bytes, 1), 0, 0

    def update(self, nbytes, ntokens):
        self.done += nbytes
        self.tokens += ntokens
        frac = min(self.done / self.total, 1.0)
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        print(f"\rtokenizing [{bar}] {100 * frac:5.1f}%  {self.tokens:,} tokens", end="",
              file=sys.stderr, flush=True)

    def close(self):
        print(file=sys.stderr)


def write_shards(tokens, out, name, split, shard_tokens):
    """tokens (array of uint16) -> DIR/NAME_split_%06d.bin, at most shard_tokens each."""
    paths = []
    for k, first in enumerate(range(0, len(tokens), shard_tokens)):
        part = tokens[first:first + shard_tokens]
        path = os.path.join(out, f"{name}_{split}_{k:06d}.bin")
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(struct.pack(f"<{HEADER_INTS}i", MAGIC, VERSION, len(part),
                                *([0] * (HEADER_INTS - 3))))
            if sys.byteorder != "little":
                part = array("H", part)
                part.byteswap()
            part.tofile(f)
        os.replace(tmp, path)
        paths.append(path)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", metavar="INPUT", help="text files, one document each")
    ap.add_argument("--out", required=True, help="directory for the shards (created)")
    ap.add_argument("--tokenizer", required=True, help="gpt2, bytes, or a tokenizer.json path")
    ap.add_argument("--gpt2-ranks", help="GPT-2's byte-pair ranks in tiktoken's format, for "
                    "--tokenizer gpt2 offline (e.g. openai-whisper's whisper/assets/gpt2.tiktoken)")
    ap.add_argument("--val-fraction", type=float, default=0.1,
                    help="share of the tokens, taken first, for validation (default 0.1)")
    ap.add_argument("--shard-tokens", type=int, default=100_000_000,
                    help="tokens per shard at most (default 100,000,000)")
    ap.add_argument("--name", default="", help="shard name prefix (default: the --out name)")
    a = ap.parse_args()
    if not 0 <= a.val_fraction < 1:
        sys.exit(f"error: --val-fraction must be in [0, 1) (got {a.val_fraction})")
    if a.shard_tokens < 1:
        sys.exit(f"error: --shard-tokens must be >= 1 (got {a.shard_tokens})")
    for path in a.inputs:
        if not os.path.isfile(path):
            sys.exit(f"error: {path}: no such file")
    encode, vocab, separator, raw = make_tokenizer(a.tokenizer, a.gpt2_ranks)
    if vocab > 65536:
        sys.exit(f"error: the tokenizer's vocabulary ({vocab}) does not fit llm.c's uint16 tokens")
    name = a.name or os.path.basename(os.path.normpath(a.out))
    os.makedirs(a.out, exist_ok=True)

    tokens = array("H")
    progress = Progress(sum(os.path.getsize(p) for p in a.inputs))
    for path in a.inputs:
        with open(path, "rb") as f:
            data = f.read()
        ids = separator + encode(data if raw else data.decode("utf-8"))
        tokens.extend(ids)
        progress.update(len(data), len(ids))
    progress.close()
    if not tokens:
        sys.exit("error: the inputs hold no tokens")
    n_val = int(round(a.val_fraction * len(tokens)))
    val = write_shards(tokens[:n_val], a.out, name, "val", a.shard_tokens) if n_val else []
    train = write_shards(tokens[n_val:], a.out, name, "train", a.shard_tokens)
    print(f"{len(tokens):,} tokens (vocabulary {vocab}): {len(tokens) - n_val:,} in "
          f"{len(train)} train shard(s), {n_val:,} in {len(val)} val shard(s), in {a.out}")
    print(f"train with: --set data.source=llmc --set \"data.path={a.out}/{name}_train_*.bin\"" +
          (f" --set \"data.val_path={a.out}/{name}_val_*.bin\"" if val else "") +
          f" --set model.vocab_size={vocab}")


if __name__ == "__main__":
    main()
