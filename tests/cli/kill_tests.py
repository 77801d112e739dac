#!/usr/bin/env python3
"""Failures: a rank killed with SIGKILL mid-run ends the whole job non-zero within the
communication timeout plus a few seconds, with a message naming the lost rank, and the
last checkpoint stays loadable; kills that land while checkpoints are being written never
leave `latest` pointing at a broken checkpoint.
Usage: kill_tests.py PPTRAIN CONFIG WORKDIR"""
import os
import shutil
import signal
import subprocess
import sys
import time

TIMEOUT_S = 8


def parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def descends_from(pid, ancestor):
    while pid > 1:
        if pid == ancestor:
            return True
        pid = parent_of(pid)
    return False


def rank_pids(rank, job_pid):
    """PIDs of the job's pptrain processes that are MPI rank `rank` (only this job's:
    other runs may share the machine)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if not descends_from(int(pid), job_pid):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"pptrain" in cmd and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            pids.append(int(pid))
    return pids


def start(pptrain, config, ckpt, extra):
    args = [pptrain, "--config", config]
    for s in ["train.steps=100000", "train.threads=1", "train.eval_every=0", "logging.every=1000",
              f"checkpoint.dir={ckpt}", f"parallel.comm_timeout_s={TIMEOUT_S}"] + extra:
        args += ["--set", s]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def wait_for(path, limit=120):
    deadline = time.time() + limit
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit(f"timed out waiting for {path}")
        time.sleep(0.05)


def loads(pptrain, config, ckpt, extra=()):
    args = [pptrain, "eval", "--config", config]
    for s in [f"checkpoint.dir={ckpt}", "checkpoint.resume=auto", "train.threads=1", *extra]:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    return out.returncode == 0 and "val_loss" in out.stdout, out.stdout + out.stderr


def kill_a_rank(pptrain, config, work):
    ckpt = os.path.join(work, "kill_rank")
    job = start(pptrain, config, ckpt, ["parallel.pp=2", "checkpoint.every=20"])
    wait_for(os.path.join(ckpt, "step_00000040"))
    victims = rank_pids(1, job.pid)
    if not victims:
        sys.exit("could not find rank 1")
    killed_at = time.time()
    os.kill(victims[0], signal.SIGKILL)
    out = job.communicate(timeout=TIMEOUT_S + 30)[0].decode(errors="replace")
    took = time.time() - killed_at
    if job.returncode == 0:
        sys.exit("the job exited 0 after losing a rank")
    if took > TIMEOUT_S + 5:
        sys.exit(f"the job took {took:.1f} s to end after losing a rank")
    if "rank 1" not in out:
        sys.exit("no message names the lost rank:\n" + out[-2000:])
    ok, text = loads(pptrain, config, ckpt)
    if not ok:
        sys.exit("the last checkpoint does not load after the kill:\n" + text)
    print(f"rank 1 killed: job exited {job.returncode} after {took:.1f} s; last checkpoint loads")


def kill_during_saves(pptrain, config, work):
    ckpt = os.path.join(work, "kill_save")
    # A checkpoint every step, so most of the run is spent saving; kill at several moments.
    model = ["model.d_model=256", "model.n_head=4"]
    extra = ["checkpoint.every=1", "checkpoint.keep=2"] + model
    for delay in (0.3, 0.55, 0.8):
        job = start(pptrain, config, ckpt,
                    extra + (["checkpoint.resume=auto"] if os.path.exists(ckpt) else []))
        wait_for(os.path.join(ckpt, "latest"))
        time.sleep(delay)
        job.kill()  # SIGKILL, no chance to clean up
        job.wait()
        ok, text = loads(pptrain, config, ckpt, model)
        if not ok:
            sys.exit(f"after a kill at +{delay} s the newest checkpoint does not load:\n{text}")
    print("killed 3 times while checkpointing every step: `latest` always loads")


def main():
    pptrain, config, work = sys.argv[1:4]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    kill_a_rank(pptrain, config, work)
    kill_during_saves(pptrain, config, work)
    print("2 passed, 0 failed")


if __name__ == "__main__":
    main()
