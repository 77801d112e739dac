#!/usr/bin/env python3
"""train.cuda_graph on the emulated GPU: the step captured at step 2 and replayed after
gives the same losses, gradient norms and validation losses, bit for bit, as the run
without it, and runs the same kernels (kernel_launches) with one host wait a step, while
the host launches none in the replayed steps: each of the STEPS - 2 replays spares the
same launches (PPTRAIN_EMULATED_LAUNCH_COUNT, the kernels the host launched, summed
over the ranks). On one rank: in bf16 with the fused attention, in fp32 with the unfused
one, and with two micro-batches and selective recomputation. In layouts of several ranks,
whose graphs hold NCCL operations on the compute stream and on the streams beside it:
the pipeline's channels (1F1B, and ZB-V with W apart from B), ZeRO-1's buckets
reduce-scattered and all-gathered beside compute, tensor and sequence parallelism, the
context-parallel ring, and the grouped messages of parallel.overlap: false. Each case
runs under its own stream order, with Open MPI's eager limits forced down. The CPU is
refused with exit code 2.
Usage: cuda_graph.py PPTRAIN_EMULATED CONFIG WORKDIR
"""
import json
import os
import shutil
import subprocess
import sys

STEPS = 5
COMMON = ["device=cuda", f"train.steps={STEPS}", "train.eval_every=3", "train.eval_batches=1",
          "parallel.micro_batch_size=4",
          "checkpoint.dir=", "logging.every=1"]
CASES = {
    "bf16": ["train.precision=bf16"],
    "fp32": ["train.precision=fp32"],
    "bf16, 2 micro-batches, selective recompute": [
        "train.precision=bf16", "parallel.micro_batches=2", "train.recompute=selective"],
}
# Several ranks: 4 sequences a micro-batch as above, split over the layout.
LAYOUTS = {
    # 8 sequences of 64 x 64 in bf16: 64 KB pipeline messages.
    "pp2 1F1B, 4 micro-batches of 8": ["parallel.pp=2", "parallel.micro_batches=4",
                                       "parallel.micro_batch_size=8", "train.precision=bf16"],
    "pp2 ZB-V, 2 virtual stages": ["parallel.pp=2", "parallel.micro_batches=4",
                                   "parallel.schedule=zb-v", "parallel.virtual_stages=2", "model.n_layer=4",
                                   "train.precision=fp32"],
    "dp2 ZeRO-1, buckets smaller than a layer": [
        "parallel.dp=2", "parallel.zero=1", "parallel.grad_bucket_mib=0.02",
        "parallel.micro_batch_size=2", "train.precision=bf16"],
    "tp2 SP x pp2, overlap off": ["parallel.tp=2", "parallel.pp=2", "parallel.micro_batches=2",
                                  "parallel.sequence_parallel=true", "parallel.overlap=false",
                                  "train.precision=bf16"],
    "cp2, fused ring": ["parallel.cp=2", "train.precision=bf16"],
}
KEYS = ["loss", "grad_norm", "val_loss", "kernel_launches", "device_syncs"]


def run(binary, config, sets, metrics, seed="0", launches=None):
    argv = [binary, "--config", config]
    for s in COMMON + sets + [f"logging.metrics={metrics}"]:
        argv += ["--set", s]
    env = dict(os.environ, PPTRAIN_EMULATED_GPUS="4", PPTRAIN_EMULATED_STREAM_SEED=seed,
               OMPI_MCA_btl_vader_eager_limit="4096", OMPI_MCA_btl_self_eager_limit="4096")
    if launches:
        env["PPTRAIN_EMULATED_LAUNCH_COUNT"] = launches
    return subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    binary, config, work = sys.argv[1:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []
    for i, (name, sets) in enumerate(list(CASES.items()) + list(LAYOUTS.items())):
        records, host_launches = {}, {}
        for graph in (False, True):
            metrics = os.path.join(work, f"{i}_{graph}.jsonl")
            count = os.path.join(work, f"{i}_{graph}.launches")
            out = run(binary, config, sets + [f"train.cuda_graph={str(graph).lower()}"], metrics,
                      seed=str(i), launches=count)
            if out.returncode != 0:
                sys.exit(f"{name}, cuda_graph {graph}: exit {out.returncode}\n{out.stderr[-3000:]}")
            if graph and "step 2: captured as a CUDA graph" not in out.stdout + out.stderr:
                failures.append(f"{name}: no capture logged")
            with open(metrics) as f:
                records[graph] = [json.loads(line) for line in f if line.strip()]
            with open(count) as f:  # one line a rank
                host_launches[graph] = sum(int(n) for n in f.read().split())
        # Every step launches the same kernels; the replayed ones launch none from the host.
        spared = host_launches[False] - host_launches[True]
        if spared <= 0 or spared % (STEPS - 2) != 0:
            failures.append(f"{name}: {host_launches[False]} host launches without the graph, "
                            f"{host_launches[True]} with it: not {STEPS - 2} steps' worth spared")
        plain, graphed = records[False], records[True]
        if len(plain) != STEPS or len(graphed) != STEPS:
            failures.append(f"{name}: {len(plain)} and {len(graphed)} records, not {STEPS}")
        for a, b in zip(plain, graphed):
            for key in KEYS:
                if a.get(key) != b.get(key):
                    failures.append(f"{name}, step {a['step']}: {key} {a.get(key)!r} without the "
                                    f"graph, {b.get(key)!r} with it")
        print(f"{name}: {len(graphed)} steps, losses {[r['loss'] for r in graphed]}, equal: "
              f"{not any(f.startswith(name + ',') for f in failures)}")
    out = run(binary, config, ["device=cpu", "train.cuda_graph=true"], os.path.join(work, "x.jsonl"))
    if out.returncode != 2 or "needs device cuda or auto" not in out.stderr:
        failures.append(f"device cpu: exit {out.returncode}, {out.stderr[-300:]!r}")
    if failures:
        sys.exit("FAIL:\n" + "\n".join(failures))
    print("ok")


if __name__ == "__main__":
    main()
