#!/usr/bin/env python3
"""The GPU presets' predictions against published training throughputs.

For each published run below (model, layout, batch, GPUs, and the figure the publication
reports), writes a config and a cluster file into WORKDIR, predicts the published layout
with `pptrain plan --this --json`, converts the prediction to the quantity the
publication reports (counting FLOPs as it does), and prints published, predicted and
their ratio, and the same prediction with communication free (links of unbounded
bandwidth): what the compute alone allows. Where a publication leaves part of the layout
unstated, every choice of the unstated part is predicted and the fastest that fits is
taken (the one needing the least memory if none fits). With --rank it also runs the
planner's own search (`--top 5`) on the same model, batch and GPUs and prints its first
layout next to the published one.
Fails when a checked figure is off by more than a factor of FACTOR: the prediction for
the A100 publications, whose runs do what pptrain's executor does; for Megatron-Core's
H100 table a bound in two halves, because those runs overlap tensor-parallel
communication with compute through userbuffers, which pptrain approaches by other means
(row blocks, sums beside the weight gradients) that its planner models with no
measurement of a GPU behind it: the free-links prediction, which pays for no communication at all, must not
be slower than the published run by more than FACTOR (the compute model is not too
slow), and the prediction with the real links must not be faster than it by more than
FACTOR (nor too fast). A free-links figure above the published one is expected: the
published run paid for its communication. A gross error of the time model fails; the
table's per-cent figures are for reading. It also fails when a published layout is
predicted not to fit its GPUs' memory: those runs did.
Usage: published.py PPTRAIN WORKDIR [--rank]
"""
import itertools
import json
import os
import shutil
import subprocess
import sys

FACTOR = 1.25

NARAYANAN = ("Narayanan et al. 2021, arXiv:2104.04473, Table 1 (layouts also from "
             "Megatron-LM examples/sc21/run_table_1.sh)")
KORTHIKANTI = "Korthikanti et al. 2022, arXiv:2205.05198, Tables 3 and 5, section 6.3"
MEGATRON_H100 = "Megatron-LM README, Training Speed and Scalability (2024-07-15, f2e5db402c)"

# What each publication reports, and how its FLOPs relate to pptrain's model FLOPs
# (flops_per_token: 72 L C^2 + 12 L T C + 6 C V per token, no recomputation).
#   tflops_eq3: TFLOP/s per GPU counted by Narayanan et al.'s equation (3),
#               96 B s l h^2 (1 + s/6h + V/16lh) per step: the layers' GEMMs four times
#               (full recomputation), the logits three times.
#   mfu:        model FLOPs (pptrain's count) per second over the device's peak.
QUANTITY = {"tflops_eq3": "TFLOP/s per GPU, eq. (3) (with recompute)", "mfu": "MFU"}


def eq3_over_model(layers, d_model, seq_len, vocab):
    """Narayanan et al.'s FLOPs per step over pptrain's model FLOPs."""
    l, h, s, v = layers, d_model, seq_len, vocab
    return 96 * (1 + s / (6 * h) + v / (16 * l * h)) / (72 * (1 + s / (6 * h) + v / (12 * l * h)))


def row(name, source, device, model, layout, global_batch, gpus, quantity, published, checked,
        **unknown):
    layers, heads, d_model, seq_len, vocab = model
    return {"name": name, "source": source, "device": device, "layers": layers, "heads": heads,
            "d_model": d_model, "seq_len": seq_len, "vocab": vocab, "layout": layout,
            "global_batch": global_batch, "gpus": gpus, "quantity": quantity,
            "published": published, "checked": checked, "unknown": unknown}


def layout(tp, pp, mbs, schedule="1f1b", v=1, recompute="full", sp=False, zero=0,
           attention="unfused", overlap=True):
    return {"tp": tp, "pp": pp, "mbs": mbs, "schedule": schedule, "v": v, "recompute": recompute,
            "sp": sp, "zero": zero, "attention": attention, "overlap": overlap}


# Narayanan et al.: A100 80 GB (Selene: NVLink, eight 200 Gb/s HDR NICs per node), full
# recomputation, the interleaved schedule where run_table_1.sh sets
# --num-layers-per-virtual-pipeline-stage; vocabulary 51,200, sequence 2048. The
# gradient reduction ran after the backward pass (parallel.overlap: false), here and in
# Korthikanti et al.
def narayanan(name, layers, heads, d_model, tp, pp, gpus, batch, mbs, v, tflops):
    sched = "interleaved" if v > 1 else "1f1b"
    return row(name, NARAYANAN, "a100-80gb", (layers, heads, d_model, 2048, 51200),
               layout(tp, pp, mbs, sched, v, "full", overlap=False), batch, gpus, "tflops_eq3", tflops, "predicted")


# Korthikanti et al.: the same machine, sequence parallelism and selective recomputation,
# no data parallelism but for the 530B run at dp 8 (section 6.3), interleaved with three
# chunks for 175B and 530B.
def korthikanti(name, layers, heads, d_model, pp, gpus, batch, mbs, v, mfu):
    sched = "interleaved" if v > 1 else "1f1b"
    return row(name, KORTHIKANTI, "a100-80gb", (layers, heads, d_model, 2048, 51200),
               layout(8, pp, mbs, sched, v, "selective", True, overlap=False), batch, gpus, "mfu", mfu, "predicted")


# Megatron-LM's H100 table: vocabulary 131,072, sequence 4096; the README's flags imply
# the distributed optimizer (ZeRO-1: --overlap-param-gather) and sequence parallelism
# (--tp-comm-overlap); the micro-batch size, schedule and recomputation are not stated.
# Attention is taken as fused (Megatron-Core's default attention backend is a fused,
# flash-style kernel; the README does not say).
def megatron_h100(name, layers, heads, d_model, tp, pp, gpus, batch, mfu):
    return row(name, MEGATRON_H100, "h100-sxm", (layers, heads, d_model, 4096, 131072),
               layout(tp, pp, 1, sp=tp > 1, zero=1, attention="fused"), batch, gpus, "mfu", mfu,
               "free links",
               mbs=[1, 2], schedule=["1f1b", "interleaved"], recompute=["none", "selective", "full"])


RUNS = [
    narayanan("1.7B", 24, 24, 2304, 1, 1, 32, 512, 16, 1, 137),
    narayanan("3.6B", 30, 32, 3072, 2, 1, 64, 512, 16, 1, 138),
    narayanan("7.5B", 36, 32, 4096, 4, 1, 128, 512, 16, 1, 142),
    narayanan("18.4B", 40, 48, 6144, 8, 1, 256, 1024, 8, 1, 135),
    narayanan("39.1B", 48, 64, 8192, 8, 2, 512, 1536, 4, 1, 138),
    narayanan("76.1B", 60, 80, 10240, 8, 4, 1024, 1792, 2, 3, 140),
    narayanan("145.6B", 80, 96, 12288, 8, 8, 1536, 2304, 2, 2, 148),
    narayanan("310.1B", 96, 128, 16384, 8, 16, 1920, 2160, 1, 2, 155),
    narayanan("529.6B", 105, 128, 20480, 8, 35, 2520, 2520, 1, 3, 163),
    narayanan("1008B", 128, 160, 25600, 8, 64, 3072, 3072, 1, 1, 163),
    korthikanti("22B", 48, 64, 6144, 1, 8, 4, 4, 1, 0.415),
    korthikanti("175B", 96, 96, 12288, 8, 64, 64, 1, 3, 0.514),
    korthikanti("530B", 105, 128, 20480, 35, 280, 280, 1, 3, 0.560),
    korthikanti("530B dp 8", 105, 128, 20480, 35, 2240, 2240, 1, 3, 0.542),
    korthikanti("1T", 128, 160, 25600, 64, 512, 512, 1, 1, 0.563),
    megatron_h100("1.7B", 24, 16, 2048, 1, 1, 48, 192, 0.41),
    megatron_h100("7.1B", 30, 32, 4096, 2, 1, 96, 192, 0.47),
    megatron_h100("16B", 32, 48, 6144, 4, 1, 192, 192, 0.49),
    megatron_h100("32B", 48, 56, 7168, 8, 1, 384, 192, 0.46),
    megatron_h100("70B", 84, 64, 8192, 8, 2, 768, 384, 0.42),
    megatron_h100("119B", 92, 80, 10240, 8, 4, 1536, 768, 0.43),
    megatron_h100("177B", 96, 96, 12288, 8, 6, 2304, 1152, 0.44),
    megatron_h100("314B", 96, 128, 16384, 8, 8, 3072, 1536, 0.48),
    megatron_h100("462B", 112, 144, 18432, 8, 16, 6144, 3072, 0.47),
]


def write_files(work, run, lay, tag, free_links=False):
    dp = run["gpus"] // (lay["tp"] * lay["pp"])
    micro_batches = run["global_batch"] // (dp * lay["mbs"])
    base = os.path.join(work, f"{run['source'].split()[0].lower()}-{run['name'].replace(' ', '')}{tag}")
    config = base + ".yaml"
    with open(config, "w") as f:
        f.write(f"# {run['name']}: {run['source']}\n"
                f"model:\n  n_layer: {run['layers']}\n  n_head: {run['heads']}\n"
                f"  d_model: {run['d_model']}\n  seq_len: {run['seq_len']}\n"
                f"  vocab_size: {run['vocab']}\n"
                f"parallel:\n  tp: {lay['tp']}\n  pp: {lay['pp']}\n  dp: {dp}\n"
                f"  micro_batch_size: {lay['mbs']}\n  micro_batches: {micro_batches}\n"
                f"  schedule: {lay['schedule']}\n  virtual_stages: {lay['v']}\n"
                f"  sequence_parallel: {'true' if lay['sp'] else 'false'}\n  zero: {lay['zero']}\n"
                f"  overlap: {'true' if lay['overlap'] else 'false'}\n"
                f"train:\n  recompute: {lay['recompute']}\n  attention: {lay['attention']}\n")
    cluster = os.path.join(work, f"{run['device']}-{run['gpus']}{'-free' if free_links else ''}.yaml")
    with open(cluster, "w") as f:
        f.write(f"nodes: {run['gpus'] // 8}\ngpus_per_node: 8\ndevice: {run['device']}\n")
        if free_links:  # communication that costs nothing: what the compute alone allows
            f.write("intra_node_gbps: 1.0e+9\ninter_node_gbps: 1.0e+9\n"
                    "latency_us: {intra_node: 1.0e-9, inter_node: 1.0e-9}\n")
    return config, cluster


def plan(pptrain, config, cluster, *args):
    r = subprocess.run([pptrain, "plan", "--json", "--config", config, "--cluster", cluster, *args],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"{config}: plan exited {r.returncode}\n{r.stderr}")
    return json.loads(r.stdout)


def choices(run):
    """The published layout, or one per choice of what the publication does not state."""
    unknown = run["unknown"]
    if not unknown:
        yield run["layout"]
        return
    keys = list(unknown)
    for values in itertools.product(*(unknown[k] for k in keys)):
        lay = dict(run["layout"], **dict(zip(keys, values)))
        if lay["schedule"] == "interleaved":
            if lay["pp"] == 1:
                continue
            for v in (2, 3, 4):
                if run["layers"] % (lay["pp"] * v) == 0:
                    yield dict(lay, v=v)
        elif lay["schedule"] == "1f1b":
            yield dict(lay, v=1)


def predicted(pptrain, work, run, free_links=False):
    """The prediction for the published layout: the fastest of its choices that fits,
    else the one needing the least memory (which then does not fit)."""
    best = None
    for n, lay in enumerate(choices(run)):
        dp = run["gpus"] // (lay["tp"] * lay["pp"])
        if run["global_batch"] % (dp * lay["mbs"]) != 0:
            continue
        micro_batches = run["global_batch"] // (dp * lay["mbs"])
        if lay["schedule"] == "interleaved" and micro_batches % lay["pp"] != 0:
            continue
        config, cluster = write_files(work, run, lay, f"-{n}" if run["unknown"] else "", free_links)
        p = plan(pptrain, config, cluster, "--this")[0]
        if "dropped" in p:
            continue
        rank = (1, -p["step_time_s"]) if p["fits"] else (0, -p["peak_memory_mib"])
        if best is None or rank > best[2]:
            best = (p, lay, rank)
    return best[:2] if best else None


def in_quantity(run, p):
    if run["quantity"] == "mfu":
        return p["mfu"]
    return p["tflops_per_gpu"] * eq3_over_model(run["layers"], run["d_model"], run["seq_len"], run["vocab"])


def describe(p):
    v = f" v{p['virtual_stages']}" if p["virtual_stages"] > 1 else ""
    return (f"tp{p['tp']} pp{p['pp']} dp{p['dp']} mbs{p['micro_batch_size']} {p['schedule']}{v} "
            f"{p['recompute']}{' sp' if p['sequence_parallel'] else ''}{' zero1' if p['zero'] else ''}")


def main():
    pptrain, work = sys.argv[1:3]
    rank = "--rank" in sys.argv[3:]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []
    print(f"{'source':12} {'model':10} {'GPUs':>5} {'quantity':42} {'published':>9} {'predicted':>9}"
          f" {'ratio':>6} {'free links':>10}  layout predicted (fits, peak GiB)")
    for run in RUNS:
        found = predicted(pptrain, work, run)
        if found is None:
            sys.exit(f"{run['name']}: the publication's layout is dropped")
        p, lay = found
        value = in_quantity(run, p)
        free = in_quantity(run, predicted(pptrain, work, run, free_links=True)[0])
        ratio = value / run["published"]
        if run["checked"] == "predicted":
            ok = 1 / FACTOR <= ratio <= FACTOR
        else:  # each half of the bound where it holds by itself: see the docstring
            ok = free / run["published"] >= 1 / FACTOR and ratio <= FACTOR
        fmt = "{:.1%}" if run["quantity"] == "mfu" else "{:.0f}"
        print(f"{run['source'][:12]:12} {run['name']:10} {run['gpus']:>5} {QUANTITY[run['quantity']]:42}"
              f" {fmt.format(run['published']):>9} {fmt.format(value):>9} {ratio:>6.2f}"
              f" {fmt.format(free):>10}  {describe(p)}"
              f" ({'fits' if p['fits'] else 'does not fit'}, {p['peak_memory_mib'] / 1024:.1f})"
              f"{'' if ok else '  FAIL (' + run['checked'] + ')'}"
              f"{'' if p['fits'] else '  FAIL (does not fit)'}")
        if not ok or not p["fits"]:
            failures.append(run["name"])
        if rank:
            config, cluster = write_files(work, run, lay, "-rank")
            top = plan(pptrain, config, cluster, "--top", "5")
            if top:
                print(f"{'':12} {'':10} planner's first: {describe(top[0])},"
                      f" {top[0]['tokens_per_s'] / p['tokens_per_s']:.2f}x the tokens/s predicted above")
    if failures:
        sys.exit(f"off by more than a factor of {FACTOR}, or not fitting: " + ", ".join(failures))
    print(f"{len(RUNS)} checked figures within a factor of {FACTOR}, every layout fitting")


if __name__ == "__main__":
    main()
