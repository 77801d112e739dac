#!/usr/bin/env python3
"""Bad inputs end to end: every row of docs/errors.md, made and fed to pptrain.

For each case below this script builds the bad input in a fresh temporary directory,
runs pptrain there and checks that it exits with code 2 within the time limit, that
stderr holds exactly one line and that this line is the message docs/errors.md gives
for the case (`...` in a documented message stands for any text), and that nothing in
the output looks like a crash. Every documented case must have a row here and the
other way round, so the reference cannot drift from what pptrain prints. A failing
case keeps its directory for inspection.

Usage: bad_inputs.py PPTRAIN ERRORS_MD [--mpirun PATH] [--show] [--only ID ...]
  --show  print what pptrain says for each case instead of checking it (for the docs)
"""
import argparse
import fcntl
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

TIME_LIMIT_S = 20  # per case; a hang fails the case
CRASH_SIGNS = re.compile(r"terminate called|Aborted|Segmentation fault|core dumped|"
                         r"[Ss]tack trace|Traceback|what\(\):|Assertion|signal \d+")
# The hint CLI11 prints after its own one-line parse errors.
CLI_HINT = "Run with --help for more information."
# Cases run on more than one rank: each rank prints the error line ("pptrain: ..."), and
# Open MPI adds notices of its own (the MPI_ABORT banner, "mpirun detected ..."); here
# every "pptrain:" line must be the documented one and the launcher's lines are ignored.
MULTI_RANK = {"C36", "D13", "K14", "V02", "V03"}

# A small model every case starts from (file base.yaml in the case directory).
BASE = """model: {n_layer: 2, n_head: 2, d_model: 32, seq_len: 16, vocab_size: 256}
parallel: {micro_batches: 1, micro_batch_size: 2}
train: {steps: 2, warmup_steps: 0, threads: 1, eval_batches: 1}
checkpoint: {dir: ""}
logging: {every: 1, level: warn}
"""
CKPT_STEP = "step_00000002"


def llmc(magic=20240520, version=1, count=None, tokens=range(100), extra=b""):
    """An llm.c token shard: 256 int32 header words, then uint16 tokens."""
    tokens = list(tokens)
    header = [magic, version, len(tokens) if count is None else count] + [0] * 253
    return struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens) + extra


def u16(tokens):
    """A nanoGPT token file: raw little-endian uint16 tokens."""
    tokens = list(tokens)
    return struct.pack(f"<{len(tokens)}H", *tokens)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x01]))


def overwrite(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def truncate(path, keep_fraction):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(int(size * keep_fraction))


HELD_LOCKS = []  # lock files held open (and locked) until the script ends


def hold_lock(ckpt_dir):
    """Locks ckpt_dir as a running pptrain would, recording a holder on another host."""
    os.makedirs(ckpt_dir, exist_ok=True)
    f = open(os.path.join(ckpt_dir, ".lock"), "w")
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    f.write("otherhost 4242\n")
    f.flush()
    HELD_LOCKS.append(f)


# Setup actions: ("file", NAME, BYTES_OR_TEXT), ("ckpt", DIR) copies the trained
# checkpoint dir there, ("call", FN, RELATIVE_PATH) changes a file, ("mkdir", NAME),
# ("env", NAME, VALUE) sets an environment variable for the run.
def F(name, content):
    return ("file", name, content)


def CK(name="ck"):
    return ("ckpt", name)


def ENV(name, value):
    return ("env", name, value)


def edit_step(path):
    """Changes meta.json's step 2 to 3, as a hand edit would."""
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(text.replace('"step": 2', '"step": 3'))


STEP = f"ck/{CKPT_STEP}"
TRAIN = ["--config", "base.yaml"]
# GPT-3's 175B shape: 2.8 TB of fp32 weights, gradients and moments a rank, more than any
# host has, even with every change the planner may suggest.
HUGE = ["--set", "model.n_layer=96", "--set", "model.n_head=96", "--set", "model.d_model=12288"]
CHECK = ["check-config", "--config", "base.yaml"]
RESUME = ["--set", f"checkpoint.resume={STEP}", "--set", "checkpoint.dir=ck2"]
# Under a launcher started by hand: "{mpi}" in a case's argv becomes this command.
MPI = ["env", "OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
       "{mpirun}", "-np", "2", "--oversubscribe"]

# (id, setup actions, argv after the pptrain binary; "{mpi}" first runs it under mpirun)
CASES = [
    # Command line.
    ("A01", [], ["--no-such-flag"]),
    ("A02", [], []),
    ("A03", [], ["--config", "missing.yaml"]),
    ("A04", [], ["trian", "--config", "base.yaml"]),
    ("A05", [], CHECK + ["--set", "train.lr"]),
    ("A06", [], CHECK + ["--set", "train.stepz=5"]),
    ("A07", [], CHECK + ["--set", "logging.trace_steps=[1,"]),
    ("A08", [], ["eval", "--config", "base.yaml"]),
    ("A09", [], ["--config", "."]),
    ("A10", [("call", os.mkfifo, "f.yaml")], ["--config", "f.yaml"]),
    ("A11", [], ["--config", "/dev/zero"]),
    ("A12", [F("big.yaml", "# padding\n" * 500000)], ["--config", "big.yaml"]),
    ("A13", [], CHECK + ["--set", "a" * 100000 + "=1"]),
    # Config file: syntax, keys, types.
    ("C01", [F("bad.yaml", "model:\n  n_layer: 2\n  n_head: : 3\n")], ["--config", "bad.yaml"]),
    ("C02", [F("bad.yaml", "model:\n  n_layers: 4\n")], ["--config", "bad.yaml"]),
    ("C03", [F("bad.yaml", "train:\n  lr: 0.1\n  lr: 0.2\n")], ["--config", "bad.yaml"]),
    ("C04", [F("bad.yaml", "model:\n  n_layer: 2.5\n")], ["--config", "bad.yaml"]),
    ("C05", [F("bad.yaml", 'train:\n  steps: "5"\n')], ["--config", "bad.yaml"]),
    ("C06", [F("bad.yaml", "train:\n  lr: fast\n")], ["--config", "bad.yaml"]),
    ("C07", [], TRAIN + ["--set", "train.min_lr=3e-4", "--set", "train.lr=1e-4"]),
    ("C08", [], TRAIN + ["--set", "train.beta2=1.0"]),
    # Config: model and parallel layout.
    ("C09", [], TRAIN + ["--set", "model.d_model=33"]),
    ("C10", [], TRAIN + ["--set", "parallel.tp=3"]),
    ("C11", [], TRAIN + ["--set", "parallel.pp=3"]),
    ("C12", [], TRAIN + ["--set", "model.n_layer=4", "--set", "parallel.pp=2", "--set",
                         "parallel.virtual_stages=3"]),
    ("C13", [], TRAIN + ["--set", "model.n_layer=4", "--set", "parallel.pp=2", "--set",
                         "parallel.schedule=interleaved", "--set", "parallel.virtual_stages=2",
                         "--set", "parallel.micro_batches=3"]),
    ("C14", [], TRAIN + ["--set", "model.n_layer=4", "--set", "parallel.pp=2", "--set",
                         "parallel.schedule=interleaved"]),
    ("C15", [], TRAIN + ["--set", "model.n_layer=4", "--set", "parallel.pp=2", "--set",
                         "parallel.virtual_stages=2"]),
    ("C16", [], TRAIN + ["--set", "model.n_layer=4", "--set", "parallel.pp=2", "--set",
                         "parallel.layers_per_stage=[1,2]"]),
    ("C17", [], TRAIN + ["--set", "model.n_layer=4", "--set", "parallel.pp=2", "--set",
                         "parallel.layers_per_stage=[4]"]),
    ("C18", [], TRAIN + ["--set", "parallel.zero=1"]),
    ("C19", [], TRAIN + ["--set", "parallel.schedule=pipedream"]),
    ("C20", [], TRAIN + ["--set", "data.source=llmc"]),
    ("C21", [F("a.txt", "hello " * 100)],
     TRAIN + ["--set", "data.source=text", "--set", "data.path=a.txt", "--set",
              "model.vocab_size=100"]),
    ("C22", [], TRAIN + ["--set", "data.path=train.bin"]),
    ("C23", [], TRAIN + ["--set", "train.precision=bf16"]),
    ("C24", [], TRAIN + ["--set", "train.peak_tflops=-1"]),
    ("C25", [], TRAIN + ["--set", "model.n_layer=4", "--set", "parallel.pp=2", "--set",
                         "parallel.schedule=zb-v"]),
    ("C26", [], TRAIN + ["--set", "parallel.schedule_costs=[1, 0, 1]"]),
    ("C27", [], TRAIN + ["--set", "parallel.message_mode=eager"]),
    ("C28", [F("bad.yaml", "data:\n  path: " + "x" * 1000000 + "\n")],
     ["--config", "bad.yaml"]),
    ("C35", [], TRAIN + HUGE),
    ("C36", [], TRAIN + HUGE + ["--set", "parallel.dp=2"]),
    ("C37", [], TRAIN + ["--set", "parallel.cp=3"]),
    ("C29", [], CHECK + ["--set", "model.vocab_size=2147483600"]),
    ("C30", [], CHECK + ["--set", "parallel.dp=1000000"]),
    ("C31", [], CHECK + ["--set", "parallel.pp=1024", "--set", "parallel.dp=1024"]),
    ("C32", [], CHECK + ["--set", "parallel.micro_batches=1048576", "--set",
                         "parallel.micro_batch_size=1048576"]),
    ("C33", [], TRAIN + ["--set", "parallel.sequence_parallel=true"]),
    ("C34", [], TRAIN + ["--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=yes"]),
    # Data files.
    ("D01", [], TRAIN + ["--set", "data.source=llmc", "--set", "data.path=none.bin"]),
    ("D02", [F("d.bin", llmc(magic=1234))],
     TRAIN + ["--set", "data.source=llmc", "--set", "data.path=d.bin"]),
    ("D03", [F("d.bin", llmc(version=2))],
     TRAIN + ["--set", "data.source=llmc", "--set", "data.path=d.bin"]),
    ("D04", [F("d.bin", llmc(count=1000))],
     TRAIN + ["--set", "data.source=llmc", "--set", "data.path=d.bin"]),
    ("D05", [F("d.bin", llmc(extra=b"\0\0\0"))],
     TRAIN + ["--set", "data.source=llmc", "--set", "data.path=d.bin"]),
    ("D06", [F("d.bin", b"\0" * 100)],
     TRAIN + ["--set", "data.source=llmc", "--set", "data.path=d.bin"]),
    ("D07", [F("d.bin", u16(range(50)) + b"\0")],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin"]),
    ("D08", [F("d.bin", u16([1, 2, 3, 300] + [4] * 50))],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin"]),
    ("D09", [F("d.bin", u16(range(10)))],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin"]),
    ("D10", [F("d.bin", b"")],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin"]),
    ("D11", [F("d.bin", u16(range(100))), F("v.bin", u16(range(8)))],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin", "--set",
              "data.val_path=v.bin"]),
    ("D12", [("mkdir", "d.bin")],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin"]),
    ("D13", [F("d.bin", u16([1, 2, 3, 300] + [4] * 50))],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin", "--set",
              "parallel.pp=2"]),
    ("D14", [("call", os.mkfifo, "d.bin")],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin"]),
    ("D15", [F("d.bin", u16(range(100))), ("call", os.mkfifo, "v.bin")],
     TRAIN + ["--set", "data.source=nanogpt", "--set", "data.path=d.bin", "--set",
              "data.val_path=v.bin"]),
    ("D16", [], TRAIN + ["--set", "data.source=llmc", "--set", "data.path=shard_*.bin"]),
    ("D17", [F("s_000.bin", llmc()), F("s_001.bin", llmc(magic=7))],
     TRAIN + ["--set", "data.source=llmc", "--set", "data.path=s_*.bin"]),
    # Checkpoints (ck/ holds one trained at step 2 by BASE; ck2/ is an empty new dir).
    ("K01", [CK(), ("call", lambda p: flip_byte(p, os.path.getsize(p) - 100),
                    f"{STEP}/model.safetensors")], TRAIN + RESUME),
    ("K02", [CK(), ("call", lambda p: truncate(p, 0.5), f"{STEP}/model.safetensors")],
     TRAIN + RESUME),
    ("K03", [CK(), ("call", os.remove, f"{STEP}/meta.json")], TRAIN + RESUME),
    ("K04", [CK(), ("call", lambda p: truncate(p, 0.5), f"{STEP}/meta.json")], TRAIN + RESUME),
    ("K05", [CK(), ("call", os.remove, f"{STEP}/optimizer.safetensors")], TRAIN + RESUME),
    ("K06", [CK()], TRAIN + RESUME + ["--set", "model.d_model=64"]),
    ("K07", [CK()], TRAIN + RESUME + ["--set", "model.n_layer=3"]),
    ("K08", [("mkdir", "notckpt")],
     TRAIN + ["--set", "checkpoint.resume=notckpt", "--set", "checkpoint.dir=ck2"]),
    ("K09", [], TRAIN + ["--set", "checkpoint.resume=nowhere", "--set", "checkpoint.dir=ck2"]),
    ("K10", [CK()], TRAIN + ["--set", "checkpoint.dir=ck"]),
    ("K11", [CK(), F("ck/latest", "garbage\n")],
     TRAIN + ["--set", "checkpoint.resume=ck", "--set", "checkpoint.dir=ck2"]),
    ("K12", [CK()], ["eval", "--config", "base.yaml", "--set", "checkpoint.resume=ck/step_9"]),
    ("K13", [CK(), ("call", lambda p: flip_byte(p, 3000), f"{STEP}/model.safetensors")],
     TRAIN + ["--set", "checkpoint.resume=auto", "--set", "checkpoint.dir=ck"]),
    ("K14", [CK()], TRAIN + RESUME + ["--set", "model.d_model=64", "--set", "parallel.pp=2"]),
    ("K15", [CK(), ("call", lambda p: overwrite(p, 0, b"\xff" * 6), f"{STEP}/model.safetensors")],
     TRAIN + RESUME),
    ("K16", [CK(), F("ck/latest", "step_00000007\n")],
     TRAIN + ["--set", "checkpoint.resume=ck", "--set", "checkpoint.dir=ck2"]),
    ("K17", [], ["eval", "--config", "base.yaml", "--set", "checkpoint.resume=auto", "--set",
                 "checkpoint.dir=ck"]),
    ("K18", [CK()], TRAIN + RESUME + ["--set", "model.seq_len=32"]),
    ("K19", [CK()], TRAIN + RESUME + ["--set", "model.n_head=4"]),
    ("K20", [CK(), ("call", edit_step, f"{STEP}/meta.json")], TRAIN + RESUME),
    ("K21", [CK(), ("call", os.remove, f"{STEP}/meta.sum")], TRAIN + RESUME),
    ("K22", [CK(), ("call", os.remove, "ck/latest"), ("mkdir", "ck/latest")],
     TRAIN + ["--set", "checkpoint.resume=auto", "--set", "checkpoint.dir=ck"]),
    ("K23", [CK(), ("call", os.remove, "ck/latest"), ("call", os.mkfifo, "ck/latest")],
     TRAIN + ["--set", "checkpoint.resume=ck", "--set", "checkpoint.dir=ck2"]),
    ("K24", [("call", hold_lock, "ck2")], TRAIN + ["--set", "checkpoint.dir=ck2"]),
    ("K25", [CK(), ("call", lambda p: shutil.copytree(p, p[:-1] + "3"), STEP)],
     TRAIN + ["--set", "checkpoint.resume=ck/step_00000003", "--set", "checkpoint.dir=ck2"]),
    ("K26", [CK()], TRAIN + ["--set", "checkpoint.init_from=ck/step_00000002", "--set",
                             "checkpoint.dir=ck2", "--set", "model.d_model=64"]),
    ("K27", [], TRAIN + ["--set", "checkpoint.init_from=nohf", "--set", "checkpoint.dir=ck2"]),
    # Output paths.
    ("P01", [F("afile", "x")], TRAIN + ["--set", "logging.metrics=afile/m.jsonl"]),
    ("P02", [F("afile", "x")], TRAIN + ["--set", "logging.trace=afile/t.json", "--set",
                                        "logging.trace_steps=[1]"]),
    ("P03", [F("afile", "x")], TRAIN + ["--set", "checkpoint.dir=afile/ck"]),
    # Device and launcher.
    ("V01", [], TRAIN + ["--set", "device=cuda"]),
    ("V02", [], ["{mpi}"] + TRAIN),
    ("V03", [], ["{mpi}"] + TRAIN + ["--set", "parallel.pp=2", "--set", "parallel.dp=2"]),
    ("V04", [], TRAIN + ["--set", "device=auto", "--set", "train.precision=bf16"]),
    ("V05", [ENV("OMPI_COMM_WORLD_RANK", "x"), ENV("OMPI_COMM_WORLD_SIZE", "1")], CHECK),
    ("V06", [ENV("SLURM_PROCID", "0"), ENV("SLURM_STEP_ID", "0"), ENV("SLURM_NTASKS", "abc")],
     CHECK),
]


def setup(case_dir, actions, ckpt_src):
    """Makes the case's files; returns the environment variables it sets."""
    env = {}
    for a in actions:
        if a[0] == "file":
            path = os.path.join(case_dir, a[1])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(a[2].encode() if isinstance(a[2], str) else a[2])
        elif a[0] == "ckpt":
            shutil.copytree(ckpt_src, os.path.join(case_dir, a[1]))
        elif a[0] == "mkdir":
            os.makedirs(os.path.join(case_dir, a[1]))
        elif a[0] == "env":
            env[a[1]] = a[2]
        else:
            a[1](os.path.join(case_dir, a[2]))
    return env


def run(pptrain, case_dir, argv, mpirun="mpirun", env=None):
    cmd = [pptrain] + argv
    if argv[:1] == ["{mpi}"]:
        cmd = [mpirun if a == "{mpirun}" else a for a in MPI] + [pptrain] + argv[1:]
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=case_dir, capture_output=True, text=True, errors="replace",
                           timeout=TIME_LIMIT_S, env=dict(os.environ, **(env or {})))
    except subprocess.TimeoutExpired as e:
        return None, str(e.stdout or ""), str(e.stderr or ""), time.monotonic() - start
    return p.returncode, p.stdout, p.stderr, time.monotonic() - start


def documented(errors_md):
    """{id: message} from the table rows of errors.md: | `ID` | ... | `message` | 2 |"""
    rows = {}
    with open(errors_md, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\|\s*`?([A-Z]\d\d)`?\s*\|", line)
            if not m:
                continue
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            rows[m.group(1)] = (cells[-2].strip("`").replace("\\|", "|"), cells[-1])
    return rows


def pattern(message):
    """A regex for a documented message: literal text, `...` matching anything."""
    return re.compile("".join(".*" if part == "..." else re.escape(part)
                              for part in re.split(r"(\.\.\.)", message)) + r"\Z")


def make_checkpoint(pptrain, root):
    """Trains BASE for 2 steps into root/ck; returns that checkpoint root."""
    work = os.path.join(root, "_ckpt")
    os.makedirs(work)
    with open(os.path.join(work, "base.yaml"), "w") as f:
        f.write(BASE)
    rc, out, err, _ = run(pptrain, work, TRAIN + ["--set", "checkpoint.dir=ck"])
    if rc != 0:
        sys.exit(f"could not train the checkpoint fixture (exit {rc}):\n{out}{err}")
    return os.path.join(work, "ck")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pptrain")
    ap.add_argument("errors_md")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--show", action="store_true")
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()
    pptrain = os.path.abspath(args.pptrain)
    docs = {} if args.show else documented(args.errors_md)
    failures = []
    if not args.show:
        ids = {c[0] for c in CASES}
        for missing in sorted(set(docs) - ids):
            failures.append(f"{missing}: documented in {args.errors_md} but has no case here")
    root = tempfile.mkdtemp(prefix="pptrain-errors-")
    try:
        ckpt = make_checkpoint(pptrain, root)
        for case_id, actions, argv in CASES:
            if args.only and case_id not in args.only:
                continue
            case_dir = os.path.join(root, case_id)
            os.makedirs(case_dir)
            with open(os.path.join(case_dir, "base.yaml"), "w") as f:
                f.write(BASE)
            env = setup(case_dir, actions, ckpt)
            rc, out, err, secs = run(pptrain, case_dir, argv, args.mpirun, env)
            lines = [l for l in err.splitlines() if l.strip() and l != CLI_HINT]
            if case_id in MULTI_RANK:
                lines = [l for l in lines if l.startswith("pptrain:")]
            if args.show:
                print(f"{case_id} rc={rc} {secs:.2f}s stderr lines={len(lines)}")
                for l in err.splitlines():
                    print(f"   | {l}")
                if CRASH_SIGNS.search(out):
                    print("   stdout: " + out.replace("\n", "\n   stdout: "))
                continue
            problems = []
            if rc is None:
                problems.append(f"no exit within {TIME_LIMIT_S} s")
            elif rc != 2:
                problems.append(f"exit code {rc}, expected 2")
            if case_id not in docs:
                problems.append(f"not documented in {args.errors_md}")
            else:
                message, code = docs[case_id]
                if code != "2":
                    problems.append(f"documented exit code is {code!r}, expected 2")
                if len(lines) != 1 and not (case_id in MULTI_RANK and lines):
                    problems.append(f"{len(lines)} lines on stderr, expected one")
                for line in lines:
                    if not pattern(message).match(line):
                        problems.append(f"message differs from the documented one:\n"
                                        f"    got:        {line}\n    documented: {message}")
            if CRASH_SIGNS.search(out + err):
                problems.append("output looks like a crash")
            if problems:
                failures.append(f"{case_id}: pptrain {' '.join(argv)} (in {case_dir}):\n  " +
                                "\n  ".join(problems) + f"\n  stderr:\n{err}")
            else:
                print(f"ok {case_id} ({secs:.2f} s)")
    finally:
        if not failures:
            shutil.rmtree(root, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
