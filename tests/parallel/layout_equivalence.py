#!/usr/bin/env python3
"""Every parallel layout trains to the single-rank losses.

Runs pptrain on a tiny fp32 model in the single-rank layout and in each parallel layout
(pptrain starts its own ranks through mpirun), then compares the metrics files: the
first step's loss and gradient norm to 1e-6 relative, every loss over the run to 1e-4.
The global batch (dp * micro_batches * micro_batch_size) is the same in every layout
but pp2_m3, which is compared with a single-rank run of its own batch.
Every schedule runs at pp 2 and 4 with messages of 64 KiB or more, in the CPU's message
mode and some in the grouped one GPUs use, and Open MPI's eager limits are forced down,
so that no message is buffered: a schedule that could deadlock does.
Activation recomputation (selective and full, on all or some layers) runs in several of
these layouts and must give that layout's losses bit for bit, as must parallel.overlap:
false (gradient reductions after the backward pass, also with buckets smaller than a
layer and ZeRO-1). Sequence parallelism runs in
every tensor-parallel layout and schedule, with and without recomputation, and must give
that layout's losses and gradient norms within 1e-6 relative at every step (only sums are
reordered); its checkpoints resume without it and the other way round.
Usage: layout_equivalence.py PPTRAIN CONFIG WORKDIR [NAME ...] [KEY=VALUE ...]
(KEY=VALUE: a setting for every run, after the model's below.)
"""
import json
import os
import shutil
import subprocess
import sys

STEPS = 10
# name: (tp, pp, dp, micro_batches, extra overrides)
LAYOUTS = {
    "tp2": (2, 1, 1, 4, []),
    "pp2": (1, 2, 1, 4, []),
    "dp2": (1, 1, 2, 2, []),
    "tp2_pp2_dp2": (2, 2, 2, 2, []),
    "pp2_interleaved": (1, 2, 1, 4, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
    "pp4_interleaved": (1, 4, 1, 4, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
    "pp2_zb_h1": (1, 2, 1, 4, ["parallel.schedule=zb-h1"]),
    "pp4_zb_h1": (1, 4, 1, 4, ["parallel.schedule=zb-h1"]),
    "pp2_gpipe": (1, 2, 1, 4, ["parallel.schedule=gpipe"]),
    "pp4_gpipe": (1, 4, 1, 4, ["parallel.schedule=gpipe"]),
    "pp4_1f1b": (1, 4, 1, 4, []),
    "pp2_zb_v": (1, 2, 1, 4, ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
    "pp4_zb_v": (1, 4, 1, 4, ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
    "tp2_pp2_dp2_zb_v": (2, 2, 2, 2, ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
    "tp2_pp2_interleaved": (2, 2, 1, 4, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
    "tp2_pp2_zb_h1_grouped": (2, 2, 1, 4, ["parallel.schedule=zb-h1", "parallel.message_mode=grouped"]),
    "tp2_pp2_gpipe": (2, 2, 1, 4, ["parallel.schedule=gpipe"]),
    "tp4": (4, 1, 1, 4, []),
    # The grouped message mode GPUs use (NCCL), run over MPI.
    "pp2_grouped": (1, 2, 1, 4, ["parallel.message_mode=grouped"]),
    "pp4_interleaved_grouped": (1, 4, 1, 4, ["parallel.schedule=interleaved", "parallel.virtual_stages=2",
                                             "parallel.message_mode=grouped"]),
    "pp4_zb_h1_grouped": (1, 4, 1, 4, ["parallel.schedule=zb-h1", "parallel.message_mode=grouped"]),
    "pp4_zb_v_grouped": (1, 4, 1, 4, ["parallel.schedule=zb-v", "parallel.virtual_stages=2",
                                      "parallel.message_mode=grouped"]),
    # The channels mode GPUs use (NCCL): the same steps, each kind matched in issue order.
    "pp4_zb_v_channels": (1, 4, 1, 4, ["parallel.schedule=zb-v", "parallel.virtual_stages=2",
                                       "parallel.message_mode=channels"]),
    "pp2_uneven": (1, 2, 1, 4, ["parallel.layers_per_stage=[5,3]"]),
    "pp2_auto_split": (1, 2, 1, 4, ["parallel.layers_per_stage=auto"]),
    "pp2_m3": (1, 2, 1, 3, []),  # m not a multiple of pp: against a single run of 3
    "dp2_zero1": (1, 1, 2, 2, ["parallel.zero=1"]),
    "tp2_pp2_dp2_zero1": (2, 2, 2, 2, ["parallel.zero=1"]),
    # Gradient buckets smaller than a layer (0.3 MiB: layers cut into pieces), reduced as
    # each piece's layer is done, in the B+W and the split-W schedules, with ZeRO-1's
    # in-place reduce-scatter and all-gather and a tied embedding across stages.
    "dp2_buckets": (1, 1, 2, 2, ["parallel.grad_bucket_mib=0.3"]),
    "pp2_dp2_interleaved_zero1_buckets": (1, 2, 2, 2, ["parallel.schedule=interleaved",
                                                       "parallel.virtual_stages=2", "parallel.zero=1",
                                                       "parallel.grad_bucket_mib=0.3"]),
    "tp2_pp2_dp2_zb_v_zero1_buckets": (2, 2, 2, 2, ["parallel.schedule=zb-v", "parallel.virtual_stages=2",
                                                    "parallel.zero=1", "parallel.grad_bucket_mib=0.3"]),
}
# Recomputation: (the layout it must equal bit for bit, overrides).
RECOMPUTE_CASES = {
    "tp2_selective": ("tp2", ["train.recompute=selective"]),
    "pp2_full": ("pp2", ["train.recompute=full"]),
    "pp2_gpipe_selective": ("pp2_gpipe", ["train.recompute=selective"]),
    "pp4_interleaved_full": ("pp4_interleaved", ["train.recompute=full"]),
    "pp4_zb_h1_full": ("pp4_zb_h1", ["train.recompute=full"]),
    "pp4_zb_v_full_1layer": ("pp4_zb_v", ["train.recompute=full", "train.recompute_layers=1"]),
    "pp4_zb_v_grouped_selective": ("pp4_zb_v_grouped", ["train.recompute=selective"]),
    "tp2_pp2_dp2_full": ("tp2_pp2_dp2", ["train.recompute=full"]),
    "tp2_pp2_dp2_zero1_selective": ("tp2_pp2_dp2_zero1", ["train.recompute=selective"]),
    # Gradient reductions after the backward instead of during it: the same sums.
    "dp2_no_overlap": ("dp2", ["parallel.overlap=false"]),
    "tp2_pp2_dp2_no_overlap": ("tp2_pp2_dp2", ["parallel.overlap=false"]),
    "pp2_dp2_interleaved_zero1_buckets_no_overlap": ("pp2_dp2_interleaved_zero1_buckets",
                                                     ["parallel.overlap=false"]),
    "tp2_pp2_dp2_zb_v_zero1_buckets_no_overlap": ("tp2_pp2_dp2_zb_v_zero1_buckets",
                                                  ["parallel.overlap=false"]),
}
# Sequence parallelism: (the layout it must equal within 1e-6, overrides).
SP = ["parallel.sequence_parallel=true"]
SP_CASES = {
    "tp2_sp": ("tp2", SP),
    "tp4_sp": ("tp4", SP),
    "tp2_pp2_dp2_sp": ("tp2_pp2_dp2", SP),
    "tp2_pp2_dp2_zb_v_sp": ("tp2_pp2_dp2_zb_v", SP),
    "tp2_pp2_dp2_zero1_sp": ("tp2_pp2_dp2_zero1", SP),
    "tp2_pp2_dp2_zb_v_zero1_buckets_sp": ("tp2_pp2_dp2_zb_v_zero1_buckets", SP),
    "tp2_pp2_interleaved_sp": ("tp2_pp2_interleaved", SP),
    "tp2_pp2_zb_h1_grouped_sp": ("tp2_pp2_zb_h1_grouped", SP),
    "tp2_pp2_gpipe_sp": ("tp2_pp2_gpipe", SP),
    "tp2_sp_selective": ("tp2", SP + ["train.recompute=selective"]),
    "tp2_pp2_dp2_sp_full": ("tp2_pp2_dp2", SP + ["train.recompute=full"]),
    "tp2_pp2_zb_h1_grouped_sp_full": ("tp2_pp2_zb_h1_grouped", SP + ["train.recompute=full"]),
    "tp2_pp2_interleaved_sp_full_1layer": ("tp2_pp2_interleaved",
                                           SP + ["train.recompute=full", "train.recompute_layers=1"]),
}
# Resharding: saved after step 5 at (tp, pp, dp, micro_batches) = the first layout (a
# sharded checkpoint, or the single-file one of one rank), resumed in the others.
RESUME_CASES = {
    "resume_1x4x2": ((2, 2, 2, 2), (1, 4, 2, 2)),
    "resume_4x1x2": ((2, 2, 2, 2), (4, 1, 2, 2)),
    "resume_1x1x1": ((2, 2, 2, 2), (1, 1, 1, 4)),
    "resume_2x2x2": ((1, 1, 1, 4), (2, 2, 2, 2)),
}
# The model: vocab 251 is not divisible by tp=2; 8 layers; 8 sequences per step; a
# boundary array of 2 x 128 x 128 fp32 = 128 KiB, so that at tp 2 each rank's share of a
# pipeline message (1/tp of it, with or without SP) is 64 KiB.
MODEL = ["model.n_layer=8", "model.n_head=4", "model.d_model=128", "model.seq_len=128",
         "model.vocab_size=251", "parallel.micro_batch_size=2", f"train.steps={STEPS}",
         "train.threads=1", "train.eval_every=0", "train.warmup_steps=2", "logging.every=1",
         "checkpoint.dir=", "parallel.comm_timeout_s=60"]


# Every message rendezvouses: a send completes only once its receive is posted.
RENDEZVOUS_ENV = dict(os.environ, OMPI_MCA_btl_vader_eager_limit="4096",
                      OMPI_MCA_btl_self_eager_limit="4096")


def run(pptrain, config, work, name, tp, pp, dp, mb, extra):
    metrics = os.path.join(work, name + ".jsonl")
    args = [pptrain, "--config", config]
    for s in MODEL + extra + [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
                      f"parallel.micro_batches={mb}", f"logging.metrics={metrics}"]:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, env=RENDEZVOUS_ENV)
    if out.returncode != 0:
        sys.exit(f"{name}: pptrain exited {out.returncode}\n{out.stdout}\n{out.stderr}")
    with open(metrics) as f:
        return [json.loads(line) for line in f]


def check_format(step_dir, tp, pp, dp, zero=False):
    """One rank writes the single-file checkpoint; more write a shard pair per (tp, pp),
    or under ZeRO-1 a model file per (tp, pp) and an optimizer file per (tp, pp, dp)."""
    with open(os.path.join(step_dir, "meta.json")) as f:
        meta = json.load(f)
    if tp * pp * dp == 1:
        want = {"model.safetensors", "optimizer.safetensors"}
        ok = meta["format_version"] == 1
    elif zero:
        want = {f"model-tp{t}-pp{p}.safetensors" for t in range(tp) for p in range(pp)} | \
            {f"optimizer-tp{t}-pp{p}-dp{d}.safetensors" for t in range(tp) for p in range(pp)
             for d in range(dp)}
        ok = meta["format_version"] == 2 and \
            meta["layout"] == {"tp": tp, "pp": pp, "dp": dp, "optimizer_by_dp": True}
    else:
        want = {f"{k}-tp{t}-pp{p}.safetensors" for k in ("model", "optimizer")
                for t in range(tp) for p in range(pp)}
        ok = meta["format_version"] == 2 and meta["layout"] == {"tp": tp, "pp": pp, "dp": dp}
    files = set(os.listdir(step_dir)) - {"meta.json", "meta.sum", "config.json"}
    ok = ok and set(meta["files"]) == want and files == want
    print(f"checkpoint of ({tp},{pp},{dp}): format {meta['format_version']}, "
          f"{len(files)} tensor files -> {'ok' if ok else 'FAIL'}")
    return [] if ok else [f"checkpoint_format_{tp}x{pp}x{dp}"]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    pptrain, config, work = sys.argv[1:4]
    MODEL.extend(a for a in sys.argv[4:] if "=" in a)
    names = [a for a in sys.argv[4:] if "=" not in a] or list(LAYOUTS)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    singles = {4: run(pptrain, config, work, "single", 1, 1, 1, 4, [])}
    base = singles[4]
    failures = []
    for name in names:
        tp, pp, dp, mb, extra = LAYOUTS[name]
        if dp * mb not in singles:  # the single-rank run of the same global batch
            singles[dp * mb] = run(pptrain, config, work, f"single_m{dp * mb}", 1, 1, 1, dp * mb, [])
        ref = singles[dp * mb]
        rows = run(pptrain, config, work, name, tp, pp, dp, mb, extra)
        worst = max(rel(r["loss"], b["loss"]) for r, b in zip(rows, ref))
        first = (rel(rows[0]["loss"], ref[0]["loss"]), rel(rows[0]["grad_norm"], ref[0]["grad_norm"]))
        ok = len(rows) == STEPS and first[0] <= 1e-6 and first[1] <= 1e-6 and worst <= 1e-4
        print(f"{name:18} tp={tp} pp={pp} dp={dp} m={mb}: first loss {first[0]:.1e}, "
              f"first grad norm {first[1]:.1e}, worst loss {worst:.1e} -> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    # Recomputation changes no bit of any layout's losses.
    for name, (like, overrides) in RECOMPUTE_CASES.items():
        if like not in names:
            continue
        tp, pp, dp, mb, extra = LAYOUTS[like]
        rows = run(pptrain, config, work, name, tp, pp, dp, mb, extra + overrides)
        want = [json.loads(l) for l in open(os.path.join(work, like + ".jsonl"))]
        same = [r["loss"] for r in rows] == [r["loss"] for r in want] and \
            [r["grad_norm"] for r in rows] == [r["grad_norm"] for r in want]
        print(f"{name:28} against {like}: losses and grad norms "
              f"{'bit-identical' if same else 'DIFFER'} -> {'ok' if same else 'FAIL'}")
        if not same:
            failures.append(name)
    # Sequence parallelism reorders sums only.
    for name, (like, overrides) in SP_CASES.items():
        if like not in names:
            continue
        tp, pp, dp, mb, extra = LAYOUTS[like]
        rows = run(pptrain, config, work, name, tp, pp, dp, mb, extra + overrides)
        want = [json.loads(l) for l in open(os.path.join(work, like + ".jsonl"))]
        loss = max(rel(r["loss"], w["loss"]) for r, w in zip(rows, want))
        first_norm = rel(rows[0]["grad_norm"], want[0]["grad_norm"])
        norm = max(rel(r["grad_norm"], w["grad_norm"]) for r, w in zip(rows, want))
        ok = len(rows) == len(want) == STEPS and loss <= 1e-6 and first_norm <= 1e-6
        print(f"{name:34} against {like}: worst loss {loss:.1e}, grad norm {first_norm:.1e} "
              f"(step 1), {norm:.1e} (worst) -> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    # A checkpoint saved in one layout continues in others with the single-rank losses.
    saved = {}
    for name, (save_at, (tp, pp, dp, mb)) in RESUME_CASES.items():
        if save_at not in saved:
            saved[save_at] = os.path.join(work, "saved_%dx%dx%d" % save_at[:3])
            run(pptrain, config, work, "save_%dx%dx%d" % save_at[:3], *save_at,
                [f"checkpoint.dir={saved[save_at]}", "checkpoint.every=5"])
            failures += check_format(os.path.join(saved[save_at], "step_00000005"), *save_at[:3])
        ckpt = os.path.join(work, name)
        shutil.copytree(os.path.join(saved[save_at], "step_00000005"),
                        os.path.join(ckpt, "step_00000005"))
        rows = run(pptrain, config, work, name, tp, pp, dp, mb,
                   [f"checkpoint.dir={ckpt}", "checkpoint.resume=auto"])
        worst = max(rel(r["loss"], b["loss"]) for r, b in zip(rows, base[5:]))
        ok = len(rows) == STEPS - 5 and rows[0]["step"] == 6 and worst <= 1e-4
        print(f"{name:18} resumed at step 6 from {save_at[:3]}: worst loss {worst:.1e} -> "
              f"{'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    # Sequence-parallel checkpoints are the same tensors: saved with it, resumed without,
    # and the other way round.
    for name, (save_sp, load_sp) in {"resume_sp_to_plain": (SP, []),
                                     "resume_plain_to_sp": ([], SP)}.items():
        saved_dir, ckpt = os.path.join(work, "saved_" + name), os.path.join(work, name)
        run(pptrain, config, work, "save_" + name, 2, 2, 1, 4,
            save_sp + [f"checkpoint.dir={saved_dir}", "checkpoint.every=5"])
        shutil.copytree(os.path.join(saved_dir, "step_00000005"), os.path.join(ckpt, "step_00000005"))
        rows = run(pptrain, config, work, name, 2, 1, 2, 2,
                   load_sp + [f"checkpoint.dir={ckpt}", "checkpoint.resume=auto"])
        worst = max(rel(r["loss"], b["loss"]) for r, b in zip(rows, base[5:]))
        ok = len(rows) == STEPS - 5 and rows[0]["step"] == 6 and worst <= 1e-4
        print(f"{name:18} resumed at step 6 on (2, 1, 2): worst loss {worst:.1e} -> "
              f"{'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    # Memory: GPipe holds every micro-batch's activations, 1F1B about pp of them.
    if "pp2" in names and "pp2_gpipe" in names:
        peak = {n: max(json.loads(l)["peak_activations"] for l in open(os.path.join(work, n + ".jsonl")))
                for n in ("pp2", "pp2_gpipe")}
        ok = peak["pp2_gpipe"] == 4 and peak["pp2"] <= 3
        print(f"peak activation sets at pp=2, m=4: gpipe {peak['pp2_gpipe']}, 1f1b {peak['pp2']} "
              f"-> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append("activation memory")
    # ZeRO-1's blocks of every bucket: its checkpoint resumes bit for bit in its own
    # layout, and in one rank without ZeRO.
    zero = "pp2_dp2_interleaved_zero1_buckets"
    if zero in names:
        tp, pp, dp, mb, extra = LAYOUTS[zero]
        saved_dir = os.path.join(work, "saved_" + zero)
        run(pptrain, config, work, "save_" + zero, tp, pp, dp, mb,
            extra + [f"checkpoint.dir={saved_dir}", "checkpoint.every=5"])
        want = [json.loads(l) for l in open(os.path.join(work, zero + ".jsonl"))][5:]
        failures += check_format(os.path.join(saved_dir, "step_00000005"), tp, pp, dp, zero=True)
        exported = os.path.join(work, "export_" + zero)
        out = subprocess.run([pptrain, "export", "--checkpoint", os.path.join(saved_dir, "step_00000005"),
                              "--out", exported], capture_output=True, text=True, timeout=300)
        ok = out.returncode == 0 and os.path.exists(os.path.join(exported, "model.safetensors"))
        print(f"export of the ZeRO-1 checkpoint: exit {out.returncode} -> {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append("export_zero")
        for name, (rtp, rpp, rdp, rmb, rextra) in {
                "resume_zero_same": (tp, pp, dp, mb, extra),
                "resume_zero_to_one": (1, 1, 1, 4, []),
                "resume_zero_to_dp4": (1, 1, 4, 1, ["parallel.zero=1"])}.items():
            ckpt = os.path.join(work, name)
            shutil.copytree(os.path.join(saved_dir, "step_00000005"), os.path.join(ckpt, "step_00000005"))
            rows = run(pptrain, config, work, name, rtp, rpp, rdp, rmb,
                       rextra + [f"checkpoint.dir={ckpt}", "checkpoint.resume=auto"])
            if name == "resume_zero_same":
                ok = [(r["loss"], r["grad_norm"]) for r in rows] == [(r["loss"], r["grad_norm"]) for r in want]
                what = "bit-identical" if ok else "DIFFER"
            else:
                worst = max(rel(r["loss"], b["loss"]) for r, b in zip(rows, base[5:]))
                ok, what = worst <= 1e-4, f"worst loss {worst:.1e}"
            ok = ok and len(rows) == STEPS - 5
            print(f"{name:18} resumed at step 6 from {zero}: {what} -> {'ok' if ok else 'FAIL'}")
            if not ok:
                failures.append(name)
    # The same layout twice: bit-identical losses.
    again = run(pptrain, config, work, "tp2_pp2_dp2_again", 2, 2, 2, 2, [])
    first_run = [json.loads(l) for l in open(os.path.join(work, "tp2_pp2_dp2.jsonl"))] \
        if "tp2_pp2_dp2" in names else run(pptrain, config, work, "tp2_pp2_dp2", 2, 2, 2, 2, [])
    same = [r["loss"] for r in again] == [r["loss"] for r in first_run]
    print(f"tp2_pp2_dp2 twice: losses {'bit-identical' if same else 'DIFFER'}")
    if not same:
        failures.append("repeatability")
    if failures:
        sys.exit("layouts differing from the single-rank run: " + ", ".join(failures))
    print(f"{len(names) + len(RECOMPUTE_CASES) + len(SP_CASES) + len(RESUME_CASES) + 4 + (5 if zero in names else 0)} passed, "
          "0 failed")


if __name__ == "__main__":
    main()
