#!/usr/bin/env python3
"""scripts/prepare_data.py round trips, and its shards train; the README's whole loop.

  - bytes: two documents into val and train shards of at most 5000 tokens; the shards
    are llm.c's format and hold exactly the documents' bytes, val first.
  - tokenizer.json: a byte-level BPE trained here with the `tokenizers` library; the
    shards decode back to the documents' text.
  - gpt2 from GPT-2's byte-pair ranks ($PPTRAIN_GPT2_RANKS, tiktoken's format): the
    shards hold GPT-2's ids of two known sentences; a file of other ranks is refused.
  - pptrain trains on the byte shards named by globs (and says how many files it found),
    exports, and scripts/generate.py writes text with transformers' generate() from the
    export (with $PPTRAIN_TORCH_PYTHON).
Parts whose libraries are missing are skipped with a message. Offline: no tokenizer is
downloaded. Usage: prepare_data_check.py PPTRAIN SOURCE_DIR WORK_DIR
"""
import glob
import os
import shutil
import struct
import subprocess
import sys

MAGIC, VERSION = 20240520, 1


def run(args):
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def read_shards(pattern):
    """The tokens of the shards matching pattern, in sorted order; checks each header."""
    tokens = []
    for path in sorted(glob.glob(pattern)):
        raw = open(path, "rb").read()
        magic, version, count = struct.unpack("<3i", raw[:12])
        assert magic == MAGIC and version == VERSION, path
        assert len(raw) == 1024 + 2 * count, path
        tokens += list(struct.unpack(f"<{count}H", raw[1024:]))
    return tokens


def python_with(module, candidates):
    for py in candidates:
        if py and run([py, "-c", f"import {module}"]).returncode == 0:
            return py
    return ""


def main():
    pptrain, src, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prepare = os.path.join(src, "scripts", "prepare_data.py")
    docs = [os.path.join(src, "docs", "config.md"), os.path.join(src, "README.md")]
    text = [open(d, "rb").read() for d in docs]
    failures = []

    def check(name, ok, detail=""):
        print(f"{name:28} -> {'ok' if ok else 'FAIL'} {detail}")
        if not ok:
            failures.append(name)

    # Bytes: the shards hold the documents' bytes, val first, 5000 tokens a shard at most.
    out = os.path.join(work, "shards")
    r = run([sys.executable, prepare] + docs + ["--out", out, "--tokenizer", "bytes",
                                                "--val-fraction", "0.2", "--shard-tokens", "5000"])
    check("bytes: exit 0", r.returncode == 0, r.stderr[-500:] if r.returncode else "")
    val, train = read_shards(f"{out}/shards_val_*.bin"), read_shards(f"{out}/shards_train_*.bin")
    everything = b"".join(text)
    n_val = round(0.2 * len(everything))
    check("bytes: round trip", bytes(val + train) == everything and len(val) == n_val,
          f"({len(val)} val + {len(train)} train tokens)")
    shards = sorted(glob.glob(f"{out}/shards_train_*.bin"))
    check("bytes: shard sizes", len(shards) == -(-len(train) // 5000),
          f"({len(shards)} train shards)")
    check("bytes: progress bar", "tokenizing [" in r.stderr and "100.0%" in r.stderr)

    # A tokenizer.json trained here (byte-level BPE), and its round trip.
    tok_python = python_with("tokenizers", [sys.executable, os.environ.get("PPTRAIN_TORCH_PYTHON")])
    if tok_python:
        tok_file = os.path.join(work, "tokenizer.json")
        train_tok = (
            "import sys\nfrom tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers\n"
            "t = Tokenizer(models.BPE())\nt.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)\n"
            "t.decoder = decoders.ByteLevel()\n"
            "t.train(sys.argv[2:], trainers.BpeTrainer(vocab_size=400, "
            "initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))\nt.save(sys.argv[1])\n")
        r = run([tok_python, "-c", train_tok, tok_file] + docs)
        check("tokenizer.json: trained", r.returncode == 0, r.stderr[-500:])
        out_bpe = os.path.join(work, "bpe")
        r = run([tok_python, prepare] + docs + ["--out", out_bpe, "--tokenizer", tok_file,
                                                "--val-fraction", "0"])
        ids = read_shards(f"{out_bpe}/bpe_train_*.bin")
        decode = ("import sys, json\nfrom tokenizers import Tokenizer\n"
                  "t = Tokenizer.from_file(sys.argv[1])\n"
                  "sys.stdout.write(t.decode(json.load(open(sys.argv[2]))))\n")
        ids_file = os.path.join(work, "ids.json")
        open(ids_file, "w").write(str(ids))
        d = run([tok_python, "-c", decode, tok_file, ids_file])
        check("tokenizer.json: round trip", r.returncode == 0 and d.stdout == everything.decode(),
              f"({len(ids)} tokens for {len(everything)} bytes; {r.stdout.splitlines()[0] if r.stdout else r.stderr[-300:]})")
    else:
        print("the tokenizers library is unavailable: skipping the tokenizer.json round trip")

    # GPT-2's tokenizer offline, from a ranks file ($PPTRAIN_GPT2_RANKS): GPT-2's ids.
    ranks = os.environ.get("PPTRAIN_GPT2_RANKS", "")
    tik_python = python_with("tiktoken", [sys.executable, os.environ.get("PPTRAIN_TORCH_PYTHON")])
    if tik_python and os.path.isfile(ranks):
        texts = ["Hello, world!", "The quick brown fox jumps over the lazy dog."]
        gpt2_docs = []
        for i, text in enumerate(texts):
            gpt2_docs.append(os.path.join(work, f"gpt2_{i}.txt"))
            with open(gpt2_docs[-1], "w") as f:
                f.write(text)
        out_gpt2 = os.path.join(work, "gpt2")
        r = run([tik_python, prepare] + gpt2_docs + ["--out", out_gpt2, "--tokenizer", "gpt2",
                                                     "--gpt2-ranks", ranks, "--val-fraction", "0"])
        want = [50256, 15496, 11, 995, 0,
                50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]
        got = read_shards(os.path.join(out_gpt2, "gpt2_train_*.bin")) if r.returncode == 0 else []
        check("gpt2 from a ranks file: GPT-2's ids", got == want and "vocabulary 50257" in r.stdout + r.stderr,
              f"{got} {r.stdout[-300:]}{r.stderr[-300:]}")
        short = os.path.join(work, "short.tiktoken")
        with open(ranks) as src_file, open(short, "w") as dst:
            dst.writelines(src_file.readlines()[:1000])
        r = run([tik_python, prepare] + gpt2_docs + ["--out", out_gpt2, "--tokenizer", "gpt2",
                                                     "--gpt2-ranks", short])
        check("gpt2 from a short ranks file: refused", r.returncode != 0 and
              "holds 1000 ranks, not GPT-2's 50256" in r.stderr, r.stderr[-300:])
    else:
        print("tiktoken or $PPTRAIN_GPT2_RANKS unavailable: skipping the GPT-2 tokenizer check")

    # Train on the shards (globs), export, generate.
    ckpt, hf = os.path.join(work, "ckpt"), os.path.join(work, "hf")
    r = run([pptrain, "--config", os.path.join(src, "configs", "tiny.yaml"),
             "--set", "data.source=llmc", "--set", f"data.path={out}/shards_train_*.bin",
             "--set", f"data.val_path={out}/shards_val_*.bin", "--set", "model.vocab_size=256",
             "--set", "train.steps=5", "--set", "train.eval_every=0", "--set", "logging.every=5",
             "--set", "logging.metrics=", "--set", f"checkpoint.dir={ckpt}"])
    log = r.stdout + r.stderr
    check("train on the shards", r.returncode == 0 and f"in {len(shards)} files" in log,
          log[-800:] if r.returncode else "")
    r = run([pptrain, "export", "--checkpoint", ckpt, "--out", hf])
    check("export", r.returncode == 0, r.stderr[-300:])
    torch_python = python_with("transformers", [os.environ.get("PPTRAIN_TORCH_PYTHON")])
    if torch_python:
        r = run([torch_python, os.path.join(src, "scripts", "generate.py"), hf, "--tokenizer",
                 "bytes", "--prompt", "The ", "--max-new-tokens", "20", "--temperature", "0"])
        check("generate", r.returncode == 0 and r.stdout.startswith("The ") and len(r.stdout) > 5,
              repr(r.stdout[:60]) if r.returncode == 0 else r.stderr[-500:])
    else:
        print("torch and transformers unavailable: skipping generate.py")

    # Bad input: a missing file, a bad fraction.
    r = run([sys.executable, prepare, os.path.join(work, "none.txt"), "--out", out, "--tokenizer", "bytes"])
    check("missing input", r.returncode != 0 and "none.txt: no such file" in r.stderr)
    r = run([sys.executable, prepare] + docs + ["--out", out, "--tokenizer", "bytes", "--val-fraction", "1"])
    check("bad val fraction", r.returncode != 0 and "--val-fraction" in r.stderr)
    if failures:
        sys.exit("prepare_data checks failed: " + ", ".join(failures))
    print("all passed")


if __name__ == "__main__":
    main()
