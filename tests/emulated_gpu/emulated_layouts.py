#!/usr/bin/env python3
"""The CUDA path in every layout, on emulated GPUs, against the CPU backend.

Runs pptrain-emulated with `device: cuda` (the real CUDA backend and NCCL code on the
emulated runtime, cuBLASLt and NCCL, one process per rank under mpirun) in each layout,
in fp32 and bf16, and compares every step's loss and gradient norm with the single-rank
CPU run of the same global batch (pptrain, fp32): fp32 within 1e-5 relative, bf16
within 2e-2. Each layout runs with another stream seed, so the emulated streams
interleave differently from run to run, and every step of every layout must wait on
the device exactly once (device_syncs: at its end, for its loss and norm), and the
most memory any rank held is what check-config predicts, within 4 KiB (also on one GPU
with a vocabulary of 20,000, whose embedding gradient's scratch is the largest). Then:
- context parallelism: cp2 and tp2 x cp2 x pp2 in the layouts above (in bf16 the ring's
  steps on the fused kernels), cp2 with train.attention: unfused (in bf16 its loop
  kernels), and llama at cp2 (the loop kernels at head size 8, grouped key/value heads),
  with the ring's NCCL exchanges;
- llama: model.arch: llama with grouped-query attention, in three layouts and with the
  fused kernels, against the one-rank CPU run of that model;
- stream waits: each cross-stream wait of lib/ (NcclContext::stream_wait's sites),
  dropped in turn, makes the emulator's race detector end a run that uses it (dp2
  unless SITE_LAYOUTS names another), naming the two stream items; no layout above
  has a race;
- overlap: dp2, (2,2,2), tp2 x pp2 with SP and two ZeRO-1 layouts with buckets smaller
  than a layer give the same bits with parallel.overlap: false (which also sends the
  pipeline's messages in grouped batches instead of on their channels, and sums the tp
  input gradients before the weight gradients) as with it;
- checkpoints: a CUDA-path run saved at step 2 resumes on the CUDA path bit-identically
  to the run that did not stop, and reshards onto the CPU backend in another layout; so
  does a ZeRO-1 run in bf16, which gathers only the weight copy during training;
- memory: on GPUs too small for the run, it is refused (exit 2, one line) or, with
  train.memory_check: warn, warned about and run; an evaluation is not checked;
- parallel.layout: auto on 1, 2 and 8 emulated GPUs and on one CPU rank: the layout the
  planner chooses is logged, fits (the memory check passes) and trains to the losses of
  the one-rank CPU run;
- faults: a rank stopped with SIGSTOP trips the others' watchdog, which aborts the NCCL
  communicators and ends the job with exit 3, naming the rank, group and operation; so
  does one stopped while the steps replay a CUDA graph (train.cuda_graph).
Open MPI's eager limits are forced down, so no host message is buffered either.
Usage: emulated_layouts.py PPTRAIN PPTRAIN_EMULATED CONFIG WORKDIR [NAME ...]
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reliability"))
import jobs  # noqa: E402  (the reliability trials' job control: rank pids, cleanup)

STEPS = 3
SP = ["parallel.sequence_parallel=true"]
# name: (tp, pp, dp, micro_batches, overrides); 8 sequences a step in every layout.
LAYOUTS = {
    "one": (1, 1, 1, 4, []),
    "tp2": (2, 1, 1, 4, []),
    "pp2_1f1b": (1, 2, 1, 4, []),
    "pp2_zb_h1": (1, 2, 1, 4, ["parallel.schedule=zb-h1"]),
    "pp2_interleaved": (1, 2, 1, 4, ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]),
    "pp2_zb_v": (1, 2, 1, 4, ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
    "dp2": (1, 1, 2, 2, []),
    "dp2_zero1": (1, 1, 2, 2, ["parallel.zero=1"]),
    # Buckets of 0.02 MiB cut every layer into pieces; ZeRO-1 reduce-scatters and
    # all-gathers them in place on the communication stream, beside compute.
    "dp2_zero1_buckets": (1, 1, 2, 2, ["parallel.zero=1", "parallel.grad_bucket_mib=0.02"]),
    "pp2_dp2_interleaved_zero1_buckets": (1, 2, 2, 2, ["parallel.schedule=interleaved",
                                                       "parallel.virtual_stages=2", "parallel.zero=1",
                                                       "parallel.grad_bucket_mib=0.02"]),
    "tp2_pp2_dp2": (2, 2, 2, 2, []),
    "tp2_sp": (2, 1, 1, 4, SP),
    "pp2_full_recompute": (1, 2, 1, 4, ["train.recompute=full"]),
    "tp2_pp2_sp_selective": (2, 2, 1, 4, SP + ["train.recompute=selective"]),
    # W apart from B: ln1 is gathered beside the MLP's weight gradients.
    "tp2_pp2_sp_zb_v": (2, 2, 1, 4, SP + ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]),
    # Context parallelism: the ring's steps (ring_attention.cu) and its exchanges on NCCL.
    "cp2": (1, 1, 1, 4, ["parallel.cp=2"]),
    "tp2_cp2_pp2": (2, 2, 1, 4, ["parallel.cp=2"]),
    # The ring's stream and the ZeRO-1 buckets' stream beside compute at once.
    "cp2_dp2_zero1_buckets": (1, 1, 2, 2, ["parallel.cp=2", "parallel.zero=1",
                                           "parallel.grad_bucket_mib=0.02"]),
}
PRECISIONS = {"fp32": 1e-5, "bf16": 2e-2}
# Fused attention is a bf16 kernel on CUDA: tp2 with it. Under cp, auto runs the ring's
# steps on the fused kernels in bf16 (the layouts above); unfused runs its loop kernels.
ATTENTION = {"tp2_fused_bf16": ("tp2", "bf16", "fused"), "cp2_unfused_bf16": ("cp2", "bf16", "unfused")}
# The model: 4 layers, d_model 32, seq_len 16; a step is 8 sequences of 16 tokens.
MODEL = ["model.n_layer=4", "model.n_head=2", "model.d_model=32", "model.seq_len=16",
         "model.vocab_size=64", "parallel.micro_batch_size=2", f"train.steps={STEPS}",
         "train.threads=1", "train.eval_every=0", "train.eval_batches=1", "train.warmup_steps=1",
         "logging.every=1",
         "checkpoint.dir=", "parallel.comm_timeout_s=120"]
ENV = dict(os.environ, OMPI_MCA_btl_vader_eager_limit="4096", OMPI_MCA_btl_self_eager_limit="4096",
           PPTRAIN_EMULATED_GPUS="8")


def settings(tp, pp, dp, mb, extra):
    return MODEL + extra + [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
                            f"parallel.micro_batches={mb}"]


def run(binary, work, name, sets, seed=1, timeout=600):
    metrics = os.path.join(work, name + ".jsonl")
    argv = [binary, "--config", CONFIG] + jobs.overrides(sets + [f"logging.metrics={metrics}"])
    env = dict(ENV, PPTRAIN_EMULATED_STREAM_SEED=str(seed))
    start = time.time()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        sys.exit(f"{name}: exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    return rows, time.time() - start


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def worst(rows, ref):
    """The largest relative difference of loss or grad norm over the steps both have."""
    return max(max(rel(r["loss"], b["loss"]), rel(r["grad_norm"], b["grad_norm"]))
               for r, b in zip(rows, ref))


def one_wait(rows):
    """Every step waited on the device once: the host ran ahead of the device."""
    return all(r.get("device_syncs") == 1 for r in rows)


def check_layouts(names, work, failures):
    reference = {}
    for index, name in enumerate(names):
        tp, pp, dp, mb, extra = LAYOUTS[name]
        if dp * mb not in reference:
            reference[dp * mb], _ = run(PPTRAIN, work, f"cpu_m{dp * mb}", settings(1, 1, 1, dp * mb, []))
        ref = reference[dp * mb]
        for precision, bound in PRECISIONS.items():
            label = f"{name}_{precision}"
            rows, took = run(EMULATED, work, label,
                             settings(tp, pp, dp, mb, extra) +
                             ["device=cuda", f"train.precision={precision}"], seed=index + 1)
            diff = worst(rows, ref)
            ok = len(rows) == STEPS and diff <= bound and one_wait(rows)
            syncs = [r.get("device_syncs") for r in rows]
            print(f"{label:28} tp={tp} pp={pp} dp={dp}: worst {diff:.1e} (bound {bound:.0e}), "
                  f"device_syncs {syncs}, {took:.0f} s -> {'ok' if ok else 'FAIL'}", flush=True)
            if not ok:
                failures.append(label)
    for label, (like, precision, attention) in ATTENTION.items():
        tp, pp, dp, mb, extra = LAYOUTS[like]
        rows, _ = run(EMULATED, work, label, settings(tp, pp, dp, mb, extra) +
                      ["device=cuda", f"train.precision={precision}", f"train.attention={attention}"])
        diff = worst(rows, reference[dp * mb])
        ok = len(rows) == STEPS and diff <= PRECISIONS[precision] and one_wait(rows)
        print(f"{label:28} {attention} attention: worst {diff:.1e}, device_syncs "
              f"{[r.get('device_syncs') for r in rows]} -> {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(label)
    if 4 not in reference:
        reference[4], _ = run(PPTRAIN, work, "cpu_m4", settings(1, 1, 1, 4, []))
    return reference[4]


# model.arch: llama (RMSNorm, rotary embedding, SwiGLU, an untied head) with grouped-query
# attention, 4 query heads on 2 key/value heads: tp splits both. The fused kernels run at
# head size 16 (2 query heads on 1 key/value head). label: (layout, precision, model, fused)
LLAMA_GQA = ["model.arch=llama", "model.n_head=4", "model.n_kv_head=2", "model.ffn_hidden=96"]
LLAMA_FUSED = ["model.arch=llama", "model.n_head=2", "model.n_kv_head=1", "model.ffn_hidden=96"]
LLAMA = {
    "llama_tp2_pp2_dp2_fp32": ("tp2_pp2_dp2", "fp32", LLAMA_GQA, False),
    "llama_tp2_pp2_dp2_bf16": ("tp2_pp2_dp2", "bf16", LLAMA_GQA, False),
    "llama_dp2_zero1_bf16": ("dp2_zero1", "bf16", LLAMA_GQA, False),
    "llama_tp2_sp_fp32": ("tp2_sp", "fp32", LLAMA_GQA, False),
    "llama_one_fused_bf16": ("one", "bf16", LLAMA_FUSED, True),
    "llama_cp2_bf16": ("cp2", "bf16", LLAMA_GQA, False),
}


def check_llama(work, failures):
    """model.arch: llama on the CUDA path against the one-rank CPU run of the same model."""
    references = {}
    for index, (label, (like, precision, model, fused)) in enumerate(LLAMA.items()):
        tp, pp, dp, mb, extra = LAYOUTS[like]
        key = (tuple(model), dp * mb)
        if key not in references:
            references[key], _ = run(PPTRAIN, work, f"cpu_{label}",
                                     settings(1, 1, 1, dp * mb, model))
        rows, took = run(EMULATED, work, label,
                         settings(tp, pp, dp, mb, extra + model) +
                         ["device=cuda", f"train.precision={precision}"] +
                         (["train.attention=fused"] if fused else []), seed=index + 1)
        diff = worst(rows, references[key])
        ok = len(rows) == STEPS and diff <= PRECISIONS[precision] and one_wait(rows)
        print(f"{label:28} worst {diff:.1e} (bound {PRECISIONS[precision]:.0e}), device_syncs "
              f"{[r.get('device_syncs') for r in rows]}, {took:.0f} s -> {'ok' if ok else 'FAIL'}",
              flush=True)
        if not ok:
            failures.append(label)


def stream_wait_sites():
    """Every cross-stream wait in lib/: the sites of NcclContext::stream_wait, whose
    names all read "<consumer>-after-<producer>" (some are handed to it as arguments)."""
    lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "lib")
    sites = set()
    for root, _, files in os.walk(lib):
        for name in files:
            if name.endswith((".cpp", ".hpp")):
                with open(os.path.join(root, name)) as f:
                    sites.update(re.findall(r'"([a-z]+(?:-[a-z]+)*-after-[a-z]+(?:-[a-z]+)*)"', f.read()))
    return sorted(sites)


# The layout that runs each cross-stream wait (dp2 unless named here).
SITE_LAYOUTS = {"exchange-after-compute": "cp2", "compute-after-exchange": "cp2",
                "transfer-after-compute": "pp2_1f1b", "compute-after-transfer": "pp2_1f1b",
                "sum-after-compute": "tp2", "compute-after-sum": "tp2",
                # The forward's broadcasts and reduces on the tp stream already follow
                # every write of ln1 and ln2 before B gathers them; W's gather apart (zb-v)
                # follows a gather on the compute stream.
                "gather-after-compute": "tp2_pp2_sp_zb_v", "compute-after-gather": "tp2_sp",
                "broadcast-after-compute": "tp2_sp", "compute-after-broadcast": "tp2_sp",
                "reduce-after-compute": "tp2_sp", "compute-after-reduce": "tp2_sp"}


def check_dropped_waits(work, failures):
    """Each cross-stream wait dropped in turn (PPTRAIN_DROP_STREAM_WAIT): the emulator's
    race detector must end the run, naming the two unordered stream items, whatever the
    stream order (one seed is enough: it does not depend on the order). So no wait is
    there by accident and none is missing unnoticed."""
    sites = stream_wait_sites()
    if not sites:
        failures.append("no stream_wait sites found")
    for site in sites:
        layout = SITE_LAYOUTS.get(site, "dp2")
        tp, pp, dp, mb, extra = LAYOUTS[layout]
        sets = settings(tp, pp, dp, mb, extra) + ["device=cuda", "train.precision=fp32"]
        label = f"drop_{site}"
        metrics = os.path.join(work, label + ".jsonl")
        argv = [EMULATED, "--config", CONFIG] + jobs.overrides(sets + [f"logging.metrics={metrics}"])
        env = dict(ENV, PPTRAIN_EMULATED_STREAM_SEED="1", PPTRAIN_DROP_STREAM_WAIT=site)
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        race = re.search(r"emulated CUDA: stream race: .*", out.stdout + out.stderr)
        caught = out.returncode != 0 and race is not None
        print(f"{'drop ' + site + ' (' + layout + ')':52} "
              f"{'caught: exit ' + str(out.returncode) if caught else 'NOT CAUGHT'} -> "
              f"{'ok' if caught else 'FAIL'}", flush=True)
        if caught:
            print("    " + race.group(0)[:400], flush=True)
        else:
            failures.append("drop " + site)


def check_overlap(work, failures):
    """parallel.overlap: false reduces after the backward pass, sends the pipeline's
    messages in grouped batches and sums tp input gradients before the weight gradients:
    the same bits."""
    for name, precision in (("dp2", "fp32"), ("tp2_pp2_dp2", "fp32"), ("dp2_zero1_buckets", "fp32"),
                            ("tp2_pp2_sp_selective", "bf16"),
                            ("pp2_dp2_interleaved_zero1_buckets", "fp32"),
                            ("pp2_dp2_interleaved_zero1_buckets", "bf16")):
        tp, pp, dp, mb, extra = LAYOUTS[name]
        sets = settings(tp, pp, dp, mb, extra) + ["device=cuda", f"train.precision={precision}"]
        name = name + ("_bf16" if precision == "bf16" else "")
        on, _ = run(EMULATED, work, name + "_overlap_on", sets, seed=11)
        off, _ = run(EMULATED, work, name + "_overlap_off", sets + ["parallel.overlap=false"], seed=12)
        same = [(r["loss"], r["grad_norm"]) for r in on] == [(r["loss"], r["grad_norm"]) for r in off]
        ok = same and len(on) == STEPS and one_wait(off)
        print(f"{name + '_overlap_off':28} against overlap on: "
              f"{'bit-identical' if same else 'DIFFER'} -> {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append(name + "_overlap_off")


def check_checkpoints(work, failures):
    """Saved at step 2 of 4 at (2,2,2) on the CUDA path: resumed there bit for bit, and
    on the CPU backend at (1,2,1)."""
    steps = ["train.steps=4"]
    layout = settings(2, 2, 2, 2, []) + steps + ["device=cuda", "train.precision=fp32"]
    full, _ = run(EMULATED, work, "ckpt_full", layout)
    saved = os.path.join(work, "ckpt_saved")
    run(EMULATED, work, "ckpt_save", layout + [f"checkpoint.dir={saved}", "checkpoint.every=2",
                                               "train.steps=2"])
    for name, binary, sets in (
            ("ckpt_resume_cuda", EMULATED, layout),
            ("ckpt_resume_cpu", PPTRAIN, settings(1, 2, 1, 4, []) + steps)):
        ckpt = os.path.join(work, name)
        shutil.copytree(os.path.join(saved, "step_00000002"), os.path.join(ckpt, "step_00000002"))
        rows, _ = run(binary, work, name, sets + [f"checkpoint.dir={ckpt}", "checkpoint.resume=auto"],
                      seed=7)
        tail = full[2:]
        if binary == EMULATED:
            ok = [(r["loss"], r["grad_norm"]) for r in rows] == \
                 [(r["loss"], r["grad_norm"]) for r in tail]
            verdict = "bit-identical" if ok else "DIFFER"
        else:
            diff = worst(rows, tail)
            ok = diff <= PRECISIONS["fp32"]
            verdict = f"worst {diff:.1e}"
        ok = ok and len(rows) == 2 and rows[0]["step"] == 3
        print(f"{name:28} from (2,2,2) cuda at step 2: {verdict} -> {'ok' if ok else 'FAIL'}",
              flush=True)
        if not ok:
            failures.append(name)
    # ZeRO-1 in bf16 gathers only the weight copy; the fp32 master must be made whole for
    # the save, or the resumed run would start from other ranks' stale blocks.
    zero = settings(1, 2, 2, 2, LAYOUTS["pp2_dp2_interleaved_zero1_buckets"][4]) + steps + \
        ["device=cuda", "train.precision=bf16"]
    full, _ = run(EMULATED, work, "ckpt_zero_full", zero)
    saved = os.path.join(work, "ckpt_zero_saved")
    run(EMULATED, work, "ckpt_zero_save", zero + [f"checkpoint.dir={saved}", "checkpoint.every=2",
                                                   "train.steps=2"])
    ckpt = os.path.join(work, "ckpt_zero_resume")
    shutil.copytree(os.path.join(saved, "step_00000002"), os.path.join(ckpt, "step_00000002"))
    rows, _ = run(EMULATED, work, "ckpt_zero_resume",
                  zero + [f"checkpoint.dir={ckpt}", "checkpoint.resume=auto"], seed=9)
    ok = [(r["loss"], r["grad_norm"]) for r in rows] == [(r["loss"], r["grad_norm"]) for r in full[2:]]
    ok = ok and len(rows) == 2
    print(f"{'ckpt_zero_resume_bf16':28} from (1,2,2) ZeRO-1 bf16 at step 2: "
          f"{'bit-identical' if ok else 'DIFFER'} -> {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append("ckpt_zero_resume_bf16")


def check_stalled_rank(work, failures, graph):
    """SIGSTOP rank 1 of a pp=2 run: rank 0's watchdog must end the job with exit 3,
    naming rank 1 as the peer that did not answer its liveness check; with
    train.cuda_graph, while it waits for a replayed step."""
    timeout_s = 5
    name = "stall_graph" if graph else "stall"
    metrics = os.path.join(work, name + ".jsonl")
    argv = [EMULATED, "--config", CONFIG] + jobs.overrides(
        settings(1, 2, 1, 4, []) + ["device=cuda", "train.steps=100000", f"logging.metrics={metrics}",
                                    f"parallel.comm_timeout_s={timeout_s}",
                                    f"train.cuda_graph={str(graph).lower()}"])
    os.environ.update(ENV)  # jobs.Job starts the job with this process's environment
    job = jobs.Job(argv, os.path.join(work, name + ".log"))
    try:
        jobs.wait_for_path(metrics, limit=300)
        if graph:  # past the capture at step 2: replaying
            while sum(1 for _ in open(metrics)) < 3:
                if job.proc.poll() is not None:
                    jobs.fail("the graph run ended early")
                time.sleep(0.2)
        victims = jobs.rank_pids(job, 1)
        if not victims:
            jobs.fail("could not find rank 1")
        os.kill(victims[0], signal.SIGSTOP)
        stopped_at = time.time()
        rc = job.wait(timeout_s + 60)
        took = time.time() - stopped_at
        text = job.output()
        # "rank R: <operation> on group <name> did not complete within 5 s (peers: ...;
        # no answer within 1 s from 1); aborting"
        named = re.search(r"rank \d+: \w+ on group \S+ did not complete within 5 s "
                          r"\(peers: [^;]+; no answer within 1 s from 1\)", text)
        ok = rc == 3 and named
        line = next((l for l in text.splitlines() if "did not complete" in l), "(no watchdog line)")
        print(f"stalled rank 1{' (replaying a graph)' if graph else ''}: exit {rc} after {took:.1f} s; {line.strip()} -> "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            print(text[-3000:])
            failures.append(name)
    finally:
        for pid in job.descendants():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        job.kill()


def check_memory_check(work, failures):
    """GPUs of 1 MiB: the run is refused before it allocates, with one line from rank 0
    and exit 2; with train.memory_check: warn it says so and trains."""
    tp, pp, dp, mb, extra = LAYOUTS["dp2"]
    sets = settings(tp, pp, dp, mb, extra) + ["device=cuda"]
    env = dict(ENV, PPTRAIN_EMULATED_GPU_MEMORY_GIB="0.001")
    for mode, want_rc in (("error", 2), ("warn", 0)):
        metrics = os.path.join(work, f"memory_{mode}.jsonl")
        argv = [EMULATED, "--config", CONFIG] + jobs.overrides(
            sets + [f"train.memory_check={mode}", f"logging.metrics={metrics}"])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        said = [l for l in (out.stdout + out.stderr).splitlines() if "train.memory_check" in l]
        ok = out.returncode == want_rc and len(said) == 1 and "the emptiest GPU has 0.0 GiB free" in said[0]
        if mode == "warn":
            ok = ok and "starting anyway" in said[0] and os.path.exists(metrics)
        print(f"{'memory_check ' + mode:28} exit {out.returncode}: {said[0][:90] if said else 'nothing said'}"
              f"... -> {'ok' if ok else 'FAIL'}", flush=True)
        if not ok:
            failures.append("memory_check " + mode)
    # An evaluation is not held to the training prediction: it runs on the same GPUs.
    argv = [EMULATED, "eval", "--config", CONFIG] + jobs.overrides(
        settings(2, 2, 2, 2, []) + ["device=cuda", "train.precision=fp32",
                                    f"checkpoint.dir={os.path.join(work, 'ckpt_saved')}",
                                    "checkpoint.resume=auto"])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    ok = out.returncode == 0 and "val_loss" in out.stdout and "memory_check" not in out.stderr
    print(f"{'memory_check eval':28} exit {out.returncode} -> {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append("memory_check eval")


def check_predicted_memory(work, names, failures):
    """What check-config predicts for the heaviest rank equals the most any rank held
    (peak_memory_mib: the backend's own count, cuBLASLt's workspace and the kernels'
    scratch included), for the layouts run above: within 4 KiB, for the small buffers the
    plan leaves out (the gradient sync's 24 bytes of statistics; in bf16 under tp a few
    hundred bytes more)."""
    for name in names:
        tp, pp, dp, mb, extra = LAYOUTS[name]
        for precision in PRECISIONS:
            label = f"{name}_{precision}"
            expect_predicted_memory(work, label, settings(tp, pp, dp, mb, extra) +
                                    ["device=cuda", f"train.precision={precision}"], failures)
    # A vocabulary of 20,000 on one GPU: the embedding table gradient's tile bits (80 KB)
    # are the largest scratch any kernel asks for.
    sets = settings(1, 1, 1, 4, ["model.vocab_size=20000"]) + ["device=cuda", "train.precision=bf16"]
    run(EMULATED, work, "vocab_20000", sets)
    expect_predicted_memory(work, "vocab_20000", sets, failures)


def expect_predicted_memory(work, label, sets, failures):
    """The most memory any rank of run `label` (its metrics in WORK/label.jsonl) held is
    what check-config predicts for `sets`, within 4 KiB."""
    with open(os.path.join(work, label + ".jsonl")) as f:
        measured = max(json.loads(line)["peak_memory_mib"] for line in f)
    argv = [EMULATED, "check-config", "--json", "--config", CONFIG] + jobs.overrides(sets)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=ENV)
    predicted = json.loads(out.stdout)["predicted_peak_memory_mib"] if out.returncode == 0 else 0.0
    off = (measured - predicted) * 2**20
    ok = abs(off) <= 4096
    print(f"{'memory ' + label:28} predicted {predicted:.3f} MiB, measured {measured:.3f} MiB "
          f"({off:+.0f} bytes) -> {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append("memory " + label)


def check_auto_layout(work, failures, reference):
    """parallel.layout: auto with no layout key given: each machine's choice is logged
    once, with a world of that machine's size, and trains to the reference losses."""
    config = os.path.join(work, "auto.yaml")
    with open(CONFIG) as src, open(config, "w") as dst:
        dst.writelines(l for l in src if not re.match(r"\s+(tp|pp|dp):", l))
    sets = MODEL + ["parallel.micro_batches=4", "parallel.layout=auto", "train.precision=fp32"]
    for label, binary, gpus, device in (("auto_1gpu", EMULATED, 1, "cuda"), ("auto_2gpu", EMULATED, 2, "cuda"),
                                        ("auto_8gpu", EMULATED, 8, "cuda"), ("auto_cpu", PPTRAIN, 1, "cpu")):
        metrics = os.path.join(work, label + ".jsonl")
        argv = [binary, "--config", config] + jobs.overrides(
            sets + [f"device={device}", f"logging.metrics={metrics}"])
        env = dict(ENV, PPTRAIN_EMULATED_GPUS=str(gpus), PPTRAIN_EMULATED_STREAM_SEED="5")
        out = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
        said = [l for l in out.stdout.splitlines() if "parallel.layout: auto on" in l]
        machine = f"{gpus} x {'Emulated GPU' if device == 'cuda' else 'CPU rank(s)'}"
        tp, pp, dp = (int(re.search(rf"parallel\.{k}=(\d+)", said[0]).group(1)) if said else 0
                      for k in ("tp", "pp", "dp"))
        rows = []
        if out.returncode == 0 and os.path.exists(metrics):
            with open(metrics) as f:
                rows = [json.loads(line) for line in f]
        diff = worst(rows, reference) if rows else float("inf")
        ok = (out.returncode == 0 and len(said) == 1 and machine in said[0] and tp * pp * dp == gpus
              and len(rows) == STEPS and diff <= PRECISIONS["fp32"])
        choice = " ".join(f"{k}={v}" for k, v in re.findall(r"--set \S+?\.(\w+)=(\S+)", said[0])) if said else "nothing said"
        print(f"{label:28} exit {out.returncode}, worst {diff:.1e}: {choice} -> {'ok' if ok else 'FAIL'}",
              flush=True)
        if not ok:
            failures.append(label)
            print(out.stdout[-2000:], out.stderr[-2000:])


def main():
    global PPTRAIN, EMULATED, CONFIG
    PPTRAIN, EMULATED, CONFIG, work = sys.argv[1:5]
    names = sys.argv[5:] or list(LAYOUTS)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []
    reference = check_layouts(names, work, failures)
    check_predicted_memory(work, names, failures)
    check_llama(work, failures)
    check_dropped_waits(work, failures)
    check_overlap(work, failures)
    check_checkpoints(work, failures)
    for graph in (False, True):
        check_stalled_rank(work, failures, graph)
    check_memory_check(work, failures)
    check_auto_layout(work, failures, reference)
    if failures:
        sys.exit("failed: " + ", ".join(failures))
    checks = 2 * len(names) * len(PRECISIONS) + len(ATTENTION) + len(LLAMA) + len(stream_wait_sites())
    print(f"{checks + 18} passed, 0 failed")


if __name__ == "__main__":
    main()
