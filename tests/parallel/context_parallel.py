#!/usr/bin/env python3
"""Context parallelism trains to the cp = 1 losses, at sequences of 4096.

Runs pptrain on a tiny fp32 GPT with seq_len 4096 at cp 1 and in each context-parallel
layout below (pptrain starts its own ranks through mpirun), then compares the metrics:
the first step's loss and gradient norm to 1e-6 relative (a loss scaled by cp, or a
gradient summed where it should be averaged, is off by a factor of 2 or more here), and
every step's loss, gradient norm and the final validation loss to 1e-5 relative. The
ring's messages (a rank's k|v rows, 256 KiB and more) and the pipeline's are far above
Open MPI's eager limits, which are forced down, so every message rendezvouses.
Checkpoints do not depend on cp: a cp 2 run saved after step 5 resumes at cp 1 (and a
cp 1 one at cp 2, under ZeRO-1 at dp 2 the other way), and the resumed steps must give
the uninterrupted run's losses; the cp 2 and cp 1 checkpoints of step 5 export to
Hugging Face files holding the same tensors (within 1e-5: rounding of the same sums).
Usage: context_parallel.py PPTRAIN CONFIG WORKDIR [NAME ...] [KEY=VALUE ...]
(KEY=VALUE: a setting for every run, after the model's below.)
"""
import array
import json
import os
import struct
import shutil
import subprocess
import sys

from layout_equivalence import RENDEZVOUS_ENV, rel

STEPS = 10
# name: (tp, cp, pp, dp, micro_batches, extra overrides)
LAYOUTS = {
    "cp2": (1, 2, 1, 1, 2, []),
    "cp4": (1, 4, 1, 1, 2, []),
    "tp2_cp2": (2, 2, 1, 1, 2, []),
    "tp2_cp2_sp_selective": (2, 2, 1, 1, 2, ["parallel.sequence_parallel=true",
                                             "train.recompute=selective"]),
    "cp2_pp2_1f1b": (1, 2, 2, 1, 2, []),
    "cp2_pp2_zb_v": (1, 2, 2, 1, 2, ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
    "cp2_dp2_zero1_full": (1, 2, 1, 2, 1, ["parallel.zero=1", "train.recompute=full"]),
    "tp2_cp2_pp2_dp2": (2, 2, 2, 2, 1, []),
}
# Saved after step 5 at the first layout, resumed at the second: (tp, cp, pp, dp, mb).
RESUME_CASES = {
    "resume_cp2_to_cp1": ((1, 2, 1, 1, 2, []), (1, 1, 1, 1, 2, [])),
    "resume_cp1_to_cp2": ((1, 1, 1, 1, 2, []), (1, 2, 1, 1, 2, [])),
    "resume_cp2_dp2_zero1_to_dp2_zero1": ((1, 2, 1, 2, 1, ["parallel.zero=1"]),
                                          (1, 1, 1, 2, 1, ["parallel.zero=1"])),
}
# 4 layers (zb-v at pp 2 needs 4 chunks), 2 heads of 16; micro-batches of one sequence.
MODEL = ["model.n_layer=4", "model.n_head=2", "model.d_model=32", "model.seq_len=4096",
         "model.vocab_size=256", "parallel.micro_batch_size=1", f"train.steps={STEPS}",
         "train.threads=1", "train.eval_every=0", "train.eval_batches=2", "train.warmup_steps=2",
         "logging.every=1", "checkpoint.dir=", "parallel.comm_timeout_s=120"]



def run(pptrain, config, work, name, layout, more=()):
    tp, cp, pp, dp, mb, extra = layout
    metrics = os.path.join(work, name + ".jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    args = [pptrain, "--config", config]
    for s in MODEL + extra + list(more) + [
            f"parallel.tp={tp}", f"parallel.cp={cp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
            f"parallel.micro_batches={mb}", f"logging.metrics={metrics}"]:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600, env=RENDEZVOUS_ENV)
    if out.returncode != 0:
        sys.exit(f"{name}: pptrain exited {out.returncode}\n{out.stdout}\n{out.stderr}")
    with open(metrics) as f:
        return [json.loads(line) for line in f]


def safetensors_f32(path):
    """{name: fp32 values} of a safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name != "__metadata__":
            begin, end = t["data_offsets"]
            out[name] = array.array("f", data[8 + n + begin:8 + n + end])
    return out


def exports_match(pptrain, work, checkpoints):
    """The Hugging Face exports of `checkpoints` hold the same tensors within 1e-5."""
    tensors = []
    for i, ck in enumerate(checkpoints):
        out = os.path.join(work, f"export_{i}")
        subprocess.run([pptrain, "export", "--checkpoint", ck, "--out", out], check=True,
                       capture_output=True, timeout=120)
        tensors.append(safetensors_f32(os.path.join(out, "model.safetensors")))
    worst = max(abs(x - y) for name in tensors[0]
                for x, y in zip(tensors[0][name], tensors[1][name]))
    ok = tensors[0].keys() == tensors[1].keys() and worst <= 1e-5
    print(f"{'export_cp2_equals_cp1':34} worst {worst:.1e} -> {'ok' if ok else 'FAIL'}")
    return ok


def compare(name, rows, ref, first_step):
    """Worst relative differences of loss, gradient norm and validation loss."""
    worst = 0.0
    for r, b in zip(rows, ref):
        worst = max(worst, rel(r["loss"], b["loss"]), rel(r["grad_norm"], b["grad_norm"]))
        if "val_loss" in b:
            worst = max(worst, rel(r.get("val_loss", float("inf")), b["val_loss"]))
    first = max(rel(rows[0]["loss"], ref[0]["loss"]), rel(rows[0]["grad_norm"], ref[0]["grad_norm"]))
    ok = len(rows) == len(ref) and worst <= 1e-5 and (not first_step or first <= 1e-6)
    print(f"{name:34} first step {first:.1e}, worst {worst:.1e} -> {'ok' if ok else 'FAIL'}")
    return ok


def main():
    pptrain, config, work = sys.argv[1:4]
    MODEL.extend(a for a in sys.argv[4:] if "=" in a)
    names = [a for a in sys.argv[4:] if "=" not in a] or list(LAYOUTS) + list(RESUME_CASES)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    singles = {}

    def single(mb, dp):  # the cp = 1 run of the same global batch
        if (mb, dp) not in singles:
            singles[(mb, dp)] = run(pptrain, config, work, f"single_m{mb}_dp{dp}",
                                    (1, 1, 1, dp, mb, []))
        return singles[(mb, dp)]

    failures = []
    for name in names:
        if name in LAYOUTS:
            layout = LAYOUTS[name]
            ref = single(layout[4] * layout[3], 1)
            if not compare(name, run(pptrain, config, work, name, layout), ref, True):
                failures.append(name)
            continue
        save, resume = RESUME_CASES[name]
        ref = single(resume[4], resume[3]) if resume[3] > 1 else single(resume[4], 1)
        saved, ck = os.path.join(work, name + "_saved"), os.path.join(work, name + "_ck")
        run(pptrain, config, work, name + "_save", save,
            [f"checkpoint.dir={saved}", "checkpoint.every=5"])
        shutil.copytree(os.path.join(saved, "step_00000005"), os.path.join(ck, "step_00000005"))
        rows = run(pptrain, config, work, name, resume,
                   [f"checkpoint.dir={ck}", "checkpoint.resume=auto"])
        if rows[0]["step"] != 6:
            sys.exit(f"{name}: resumed at step {rows[0]['step']}, not 6")
        if not compare(name, rows, ref[5:], False):
            failures.append(name)
    saved = [os.path.join(work, n + "_saved", "step_00000005")
             for n in ("resume_cp2_to_cp1", "resume_cp1_to_cp2")]
    if all(os.path.isdir(d) for d in saved) and not exports_match(pptrain, work, saved):
        failures.append("export")
    if failures:
        sys.exit("context parallelism differs from cp 1: " + ", ".join(failures))
    print("every context-parallel layout trains to the cp 1 losses")


if __name__ == "__main__":
    main()
