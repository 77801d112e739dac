#!/usr/bin/env python3
"""The predicted peak memory is the measured one.

For each layout, recomputation mode and sequence-parallel setting below, runs `pptrain check-config --json` for the
predicted peak of the heaviest rank (predicted_peak_memory_mib) and trains a few steps
for the measured one (peak_memory_mib: the CPU backend's own count of what it allocated,
max over ranks and steps), and fails when they differ by more than 1%. Prints the table
docs/performance.md records. Open MPI's eager limits are forced down, as in the layout
tests, so that sends complete only when received.
With NAMEs, only those cases run (the llama config's, whose n_kv_head tp must divide).
Usage: memory_plan.py PPTRAIN CONFIG WORKDIR [NAME ...]
"""
import json
import os
import shutil
import subprocess
import sys

TOLERANCE = 0.01
# The model: 8 layers of d_model 128 at seq_len 128, 4 sequences per micro-batch; the
# activations of one micro-batch (about 40 MiB unfused) weigh as much as the weights,
# gradients and optimizer state together (about 26 MiB).
MODEL = ["model.n_layer=8", "model.n_head=4", "model.d_model=128", "model.seq_len=128",
         "model.vocab_size=256", "parallel.micro_batch_size=4", "train.steps=3",
         "train.threads=1", "train.eval_every=0", "logging.every=1", "checkpoint.dir=",
         "parallel.comm_timeout_s=60"]
SP = ["parallel.sequence_parallel=true"]
INTERLEAVED = ["parallel.schedule=interleaved", "parallel.virtual_stages=2"]
ZB_V = ["parallel.schedule=zb-v", "parallel.virtual_stages=2"]
# The CPU's default sends in the background; one layout also with blocking batches.
GROUPED = ["parallel.message_mode=grouped"]
# name: (tp, pp, dp, micro_batches, overrides)
CASES = {
    "pp1_none": (1, 1, 1, 4, []),
    "pp1_selective": (1, 1, 1, 4, ["train.recompute=selective"]),
    "pp1_full": (1, 1, 1, 4, ["train.recompute=full"]),
    "pp2_1f1b_none": (1, 2, 1, 4, []),
    "pp2_1f1b_selective": (1, 2, 1, 4, ["train.recompute=selective"]),
    "pp2_1f1b_full": (1, 2, 1, 4, ["train.recompute=full"]),
    "pp2_1f1b_full_2layers": (1, 2, 1, 4, ["train.recompute=full", "train.recompute_layers=2"]),
    "pp2_zb_h1_none": (1, 2, 1, 4, ["parallel.schedule=zb-h1"]),
    "pp2_zb_h1_full": (1, 2, 1, 4, ["parallel.schedule=zb-h1", "train.recompute=full"]),
    "pp4_1f1b_none": (1, 4, 1, 4, []),
    "pp4_zb_h1_selective": (1, 4, 1, 4, ["parallel.schedule=zb-h1", "train.recompute=selective"]),
    "pp4_interleaved_none": (1, 4, 1, 4, INTERLEAVED),
    "pp4_interleaved_full": (1, 4, 1, 4, INTERLEAVED + ["train.recompute=full"]),
    "pp4_interleaved_none_grouped": (1, 4, 1, 4, INTERLEAVED + GROUPED),
    # zb-v's hops between a rank's two chunks write straight into the other set.
    "pp2_zb_v_none": (1, 2, 1, 4, ZB_V),
    "pp2_zb_v_selective_grouped": (1, 2, 1, 4, ZB_V + GROUPED + ["train.recompute=selective"]),
    "tp2_pp2_selective": (2, 2, 1, 4, ["train.recompute=selective"]),
    "dp2_zero1_full": (1, 1, 2, 2, ["parallel.zero=1", "train.recompute=full"]),
    # ZeRO-1 blocks of buckets smaller than a layer, at dp 4 and beside pipelining.
    "dp4_zero1_none": (1, 1, 4, 1, ["parallel.zero=1", "parallel.grad_bucket_mib=0.25"]),
    "pp2_dp2_zero1_none": (1, 2, 2, 2, ["parallel.zero=1", "parallel.grad_bucket_mib=0.25"]),
    # Context parallelism: a rank's positions and the ring's blocks in flight.
    "cp2_none": (1, 1, 1, 4, ["parallel.cp=2"]),
    "cp4_selective": (1, 1, 1, 4, ["parallel.cp=4", "train.recompute=selective"]),
    "tp2_cp2_pp2_full": (2, 2, 1, 4, ["parallel.cp=2", "train.recompute=full"]),
    "cp2_dp2_zero1_none": (1, 1, 2, 2, ["parallel.cp=2", "parallel.zero=1"]),
    "tp2_none": (2, 1, 1, 4, []),
    "tp2_sp_none": (2, 1, 1, 4, SP),
    "tp2_sp_selective": (2, 1, 1, 4, SP + ["train.recompute=selective"]),
    "tp2_sp_full": (2, 1, 1, 4, SP + ["train.recompute=full"]),
    "tp2_pp2_zb_h1_sp_none": (2, 2, 1, 4, SP + ["parallel.schedule=zb-h1"]),
    "tp2_pp2_zb_h1_sp_full": (2, 2, 1, 4, SP + ["parallel.schedule=zb-h1", "train.recompute=full"]),
    "tp2_pp2_interleaved_sp_selective": (2, 2, 1, 4, SP + INTERLEAVED + ["train.recompute=selective"]),
    "tp2_pp4_1f1b_sp_none": (2, 4, 1, 4, SP),
}
RENDEZVOUS_ENV = dict(os.environ, OMPI_MCA_btl_vader_eager_limit="4096",
                      OMPI_MCA_btl_self_eager_limit="4096")


def settings(tp, pp, dp, mb, overrides):
    return MODEL + overrides + [f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}",
                                f"parallel.micro_batches={mb}"]


def command(pptrain, config, sets):
    args = [pptrain] + (["check-config", "--json"] if sets[0] == "plan" else []) + ["--config", config]
    for s in sets[1:]:
        args += ["--set", s]
    return args


def main():
    pptrain, config, work = sys.argv[1:4]
    names = sys.argv[4:] or list(CASES)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []
    print(f"{'layout':34} {'predicted MiB':>14} {'measured MiB':>13} {'error':>7}")
    for name in names:
        tp, pp, dp, mb, overrides = CASES[name]
        sets = settings(tp, pp, dp, mb, overrides)
        plan = subprocess.run(command(pptrain, config, ["plan"] + sets), capture_output=True,
                              text=True, timeout=120)
        if plan.returncode != 0:
            sys.exit(f"{name}: check-config exited {plan.returncode}\n{plan.stderr}")
        predicted = json.loads(plan.stdout)["predicted_peak_memory_mib"]
        metrics = os.path.join(work, name + ".jsonl")
        out = subprocess.run(command(pptrain, config, ["train"] + sets + [f"logging.metrics={metrics}"]),
                             capture_output=True, text=True, timeout=300, env=RENDEZVOUS_ENV)
        if out.returncode != 0:
            sys.exit(f"{name}: pptrain exited {out.returncode}\n{out.stdout}\n{out.stderr}")
        with open(metrics) as f:
            measured = max(json.loads(line)["peak_memory_mib"] for line in f)
        error = (predicted - measured) / measured
        ok = abs(error) <= TOLERANCE
        print(f"{name:34} {predicted:14.2f} {measured:13.2f} {error:+7.1%} {'ok' if ok else 'FAIL'}")
        if not ok:
            failures.append(name)
    if failures:
        sys.exit("predicted and measured peak memory differ by more than 1%: " + ", ".join(failures))
    print(f"{len(names)} passed, 0 failed")


if __name__ == "__main__":
    main()
