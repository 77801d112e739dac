#!/usr/bin/env python3
"""Reliability trials: what an operator of a shared cluster expects of a job. It never
hangs, never outlives its launcher, never corrupts its own or another job's files, and
a stop request or a kill at any moment leaves a checkpoint that resumes exactly.

Usage: reliability.py PPTRAIN CONFIG WORKDIR TRIAL
Trials: rank_kill, kill_during_saves, parent_kill, signals, two_runs_one_dir, full_disk,
corrupt_checkpoints, truncated_shard. Each prints what it checked and exits non-zero on the first failure."""
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import time

from jobs import Job, alive, fail, overrides, rank_pids, wait_for, wait_for_path

TIMEOUT_S = 8  # parallel.comm_timeout_s of the trials' jobs
SKIPPED = 77  # exit code of a trial this machine cannot run (ctest's SKIP_RETURN_CODE)


class Trials:
    def __init__(self, pptrain, config, work):
        self.pptrain, self.config, self.work = pptrain, config, work

    def argv(self, settings, command=()):
        base = ["train.threads=1", "train.eval_every=0", "logging.every=1000",
                f"parallel.comm_timeout_s={TIMEOUT_S}"]
        return [self.pptrain, *command, "--config", self.config] + overrides(base + settings)

    def start(self, name, settings):
        return Job(self.argv(settings), os.path.join(self.work, name + ".log"))

    def run(self, name, settings, timeout=300):
        job = self.start(name, settings)
        return job.wait(timeout), job.output()

    def loads(self, ckpt, settings=()):
        """Whether `pptrain eval` of ckpt's newest valid checkpoint succeeds."""
        argv = self.argv([f"checkpoint.dir={ckpt}", "checkpoint.resume=auto", *settings], ["eval"])
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        return out.returncode == 0 and "val_loss" in out.stdout, out.stdout + out.stderr

    # A killed rank ends the whole job within the communication timeout, naming the rank.
    def rank_kill(self):
        ckpt = os.path.join(self.work, "rank_kill")
        job = self.start("rank_kill", ["train.steps=100000", "parallel.pp=2",
                                       "checkpoint.every=20", f"checkpoint.dir={ckpt}"])
        wait_for_path(os.path.join(ckpt, "step_00000040"))
        victims = rank_pids(job, 1)
        if not victims:
            fail("could not find rank 1")
        killed_at = time.time()
        os.kill(victims[0], signal.SIGKILL)
        rc = job.wait(TIMEOUT_S + 30)
        took = time.time() - killed_at
        if rc == 0:
            fail("the job exited 0 after losing a rank")
        if took > TIMEOUT_S + 5:
            fail(f"the job took {took:.1f} s to end after losing a rank")
        if "rank 1" not in job.output():
            fail("no message names the lost rank:\n" + job.output()[-2000:])
        ok, text = self.loads(ckpt)
        if not ok:
            fail("the last checkpoint does not load after the kill:\n" + text)
        print(f"rank 1 killed: job exited {rc} after {took:.1f} s; last checkpoint loads")

    # Kills that land while checkpoints are written never leave `latest` broken.
    def kill_during_saves(self):
        ckpt = os.path.join(self.work, "kill_save")
        model = ["model.d_model=256", "model.n_head=4"]
        settings = ["train.steps=100000", "checkpoint.every=1", "checkpoint.keep=2",
                    f"checkpoint.dir={ckpt}"] + model
        for delay in (0.3, 0.55, 0.8):
            resume = ["checkpoint.resume=auto"] if os.path.exists(ckpt) else []
            job = self.start("kill_save", settings + resume)
            wait_for_path(os.path.join(ckpt, "latest"))
            time.sleep(delay)
            job.kill()
            ok, text = self.loads(ckpt, model)
            if not ok:
                fail(f"after a kill at +{delay} s the newest checkpoint does not load:\n{text}")
        print("killed 3 times while checkpointing every step: `latest` always loads")

    # SIGKILL to the pptrain that started its own ranks: mpirun and the ranks end too.
    def parent_kill(self):
        ckpt = os.path.join(self.work, "parent_kill")
        job = self.start("parent_kill", ["train.steps=1000000", "parallel.pp=2",
                                         "checkpoint.every=50", f"checkpoint.dir={ckpt}"])
        wait_for(lambda: len(rank_pids(job, 1)) > 0, "the ranks to start")
        time.sleep(2)
        tree = job.descendants()
        killed_at = time.time()
        os.kill(job.pid, signal.SIGKILL)
        job.proc.wait()
        wait_for(lambda: not any(alive(p) for p in tree), "the ranks to end", limit=10)
        took = time.time() - killed_at
        job.kill()
        if took > 2.5:
            fail(f"the ranks outlived their parent by {took:.1f} s")
        before = sorted(os.listdir(ckpt))
        time.sleep(1.5)
        if sorted(os.listdir(ckpt)) != before:
            fail("the checkpoint directory changed after the job was killed")
        if "is gone; this rank stops" not in job.output():
            fail("no rank said why it stopped:\n" + job.output()[-2000:])
        print(f"parent killed: its {len(tree)} processes ended within {took:.2f} s")

    # SIGTERM/SIGUSR1 at seeded random moments, start-up included: exit 4 (or 0 when the
    # run was already done), and the resumed run's losses are the uninterrupted run's.
    def signals(self):
        steps = 40
        rng = random.Random(20261201)
        layouts = {"1rank": [], "pp2dp2": ["parallel.pp=2", "parallel.dp=2"]}
        checked = 0
        for name, layout in layouts.items():
            def settings(run):
                return [f"train.steps={steps}", "logging.every=1", "checkpoint.every=0",
                        f"checkpoint.dir={self.work}/sig_{run}/ckpt",
                        f"logging.metrics={self.work}/sig_{run}/metrics.jsonl"] + layout
            rc, out = self.run(f"sig_{name}_whole", settings(f"{name}_whole"))
            if rc != 0:
                fail(f"the uninterrupted {name} run exited {rc}:\n{out[-2000:]}")
            whole = losses(f"{self.work}/sig_{name}_whole/metrics.jsonl")
            # The first signal comes as soon as the handlers are in place (a signal
            # before that, while the loader maps the libraries, has the default action).
            delays = [None, 0.15] + [rng.uniform(0.2, 2.5) for _ in range(2)]
            for i, delay in enumerate(delays):
                sig = (signal.SIGTERM, signal.SIGUSR1)[i % 2]
                run = f"{name}_{i}"
                job = self.start(f"sig_{run}", settings(run))
                started = time.time()
                if delay is None:
                    while not catches(job.pid, sig) and time.time() - started < 30:
                        time.sleep(0.001)
                    delay = time.time() - started
                else:
                    time.sleep(delay)
                job.proc.send_signal(sig)
                rc = job.wait(120)
                stopped = rc
                if rc not in (0, 4):
                    fail(f"{name}: {sig.name} at +{delay:.2f} s gave exit {rc}, expected 4 "
                         f"(or 0 when already done):\n{job.output()[-2000:]}")
                for attempt in range(3):  # resume until done
                    if rc == 0:
                        break
                    rc, out = self.run(f"sig_{run}_resume{attempt}",
                                       settings(run) + ["checkpoint.resume=auto"])
                    if rc not in (0, 4):
                        fail(f"{name}: the resume after {sig.name} exited {rc}:\n{out[-2000:]}")
                got = losses(f"{self.work}/sig_{run}/metrics.jsonl")
                first_stop = stopped_at(job.output())
                differ = [s for s in whole if got.get(s) != whole[s]]
                if differ:
                    fail(f"{name}: {sig.name} at +{delay:.2f} s; losses differ from the "
                         f"uninterrupted run at steps {differ[:5]}")
                checked += 1
                print(f"{name}: {sig.name} at +{delay:.2f} s: exit {stopped} ({first_stop}); "
                      f"all {steps} losses bit-identical after resuming")
        print(f"{checked} interrupted runs resumed exactly")

    # One run per checkpoint directory, also when two start at the same moment.
    def two_runs_one_dir(self):
        ckpt = os.path.join(self.work, "shared")
        first = self.start("shared_first", ["train.steps=1000000", "checkpoint.every=50",
                                            f"checkpoint.dir={ckpt}"])
        wait_for_path(os.path.join(ckpt, "latest"))
        for layout in ([], ["parallel.pp=2"]):
            rc, out = self.run("shared_second", ["train.steps=10", f"checkpoint.dir={ckpt}",
                                                 "checkpoint.resume=auto"] + layout, timeout=60)
            if rc != 2 or "in use by another run (host " not in out:
                fail(f"a second run on a held directory gave exit {rc}:\n{out[-2000:]}")
            if f"pid {first.pid})" not in out:
                fail(f"the message does not name the holder (pid {first.pid}):\n{out[-2000:]}")
        first.proc.send_signal(signal.SIGTERM)
        if first.wait(60) != 4:
            fail("the first run did not stop with exit 4:\n" + first.output()[-2000:])
        rc, out = self.run("shared_after", ["train.steps=10", f"checkpoint.dir={ckpt}",
                                            "checkpoint.resume=auto"])
        if rc != 0:
            fail(f"the directory stayed locked after its run ended (exit {rc}):\n{out[-2000:]}")
        for attempt in range(3):  # started together: one runs, the other is refused
            race = os.path.join(self.work, f"race{attempt}")
            settings = ["train.steps=30", "checkpoint.every=2", f"checkpoint.dir={race}"]
            jobs = [self.start(f"race{attempt}_{k}", settings) for k in range(2)]
            codes = sorted(j.wait(120) for j in jobs)
            if codes != [0, 2]:
                fail(f"two runs started together gave exits {codes}, expected [0, 2]:\n" +
                     "\n".join(j.output()[-1500:] for j in jobs))
        print("a held directory refuses a second run (1 rank and pp=2) naming the holder; "
              "it is free once the holder ends; 3 simultaneous starts: one ran, one refused")

    # A disk that fills up: a failed save leaves the older checkpoints; lost metrics are
    # reported. Needs root to mount a small tmpfs; skipped otherwise.
    def full_disk(self):
        disk = os.path.join(self.work, "disk")
        os.makedirs(disk, exist_ok=True)
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs",
                                                disk], capture_output=True).returncode != 0:
            print("skipped: mounting a tmpfs needs root")
            sys.exit(SKIPPED)
        try:
            ckpt = os.path.join(disk, "ck")
            rc, out = self.run("full_ckpt", ["train.steps=20", "checkpoint.every=1",
                                             "checkpoint.keep=5", f"checkpoint.dir={ckpt}"])
            if rc != 1 or "No space left on device" not in out:
                fail(f"a save on a full disk gave exit {rc}:\n{out[-2000:]}")
            ok, text = self.loads(ckpt)
            if not ok:
                fail("after a failed save the older checkpoints do not load:\n" + text)
            shutil.rmtree(ckpt)
            with open(os.path.join(disk, "filler"), "wb") as f:  # leave ~16 KiB free
                try:
                    f.write(b"\0" * (4 * 1024 * 1024 - 16 * 1024))
                except OSError:
                    pass
            metrics = os.path.join(disk, "m.jsonl")
            rc, out = self.run("full_metrics", ["train.steps=120", "logging.every=1",
                                                "checkpoint.dir=", f"logging.metrics={metrics}"])
            if rc != 0 or "logging.metrics" not in out or "could not be written" not in out:
                fail(f"metrics on a full disk: exit {rc}, expected 0 with an error:\n{out[-2000:]}")
            print("full disk: the failed save exits 1 and the older checkpoints load; "
                  "lost metrics are reported and training finishes")
        finally:
            subprocess.run(["umount", disk], capture_output=True)

    # A data shard truncated under the running job, as a pipeline rewriting shared storage
    # does: every rank ends at once with exit 3 and a line naming the file (not SIGBUS,
    # exit 135, without a word); the last checkpoint loads; a restart refuses the file.
    def truncated_shard(self):
        data = os.path.join(self.work, "shards")
        os.makedirs(data)
        rng = random.Random(20261204)
        for i in range(3):  # llm.c shards: a 256-int32 header, then uint16 tokens
            tokens = [rng.randrange(256) for _ in range(100_000)]
            with open(os.path.join(data, f"train_{i:06d}.bin"), "wb") as f:
                f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
                f.write(struct.pack(f"<{len(tokens)}H", *tokens))
        ckpt = os.path.join(self.work, "truncated_shard")
        files = ["data.source=llmc", f"data.path={data}/train_*.bin",
                 f"data.val_path={data}/train_000000.bin"]
        settings = ["train.steps=100000", "parallel.pp=2", "checkpoint.every=20",
                    f"checkpoint.dir={ckpt}"] + files
        job = self.start("truncated_shard", settings)
        wait_for_path(os.path.join(ckpt, "step_00000040"))
        victim = os.path.join(data, "train_000001.bin")
        os.truncate(victim, 2048)
        cut_at = time.time()
        rc = job.wait(TIMEOUT_S + 30)
        took = time.time() - cut_at
        named = [l for l in job.output().splitlines() if victim in l and "changed during the run" in l]
        if rc != 3 or not named:
            fail(f"a truncated shard ended the job with exit {rc}, expected 3 and a line naming "
                 f"it:\n{job.output()[-2000:]}")
        if took > 5:
            fail(f"the job took {took:.1f} s to end after its shard was truncated")
        ok, text = self.loads(ckpt, files)
        if not ok:
            fail("the last checkpoint does not load after the truncation:\n" + text)
        rc, out = self.run("truncated_restart", settings + ["checkpoint.resume=auto"])
        if rc != 2 or f"{victim}: truncated" not in out:
            fail(f"the restart on the truncated shard gave exit {rc}:\n{out[-2000:]}")
        print(f"shard truncated mid-run: exit 3 after {took:.1f} s, \"{named[0].strip()}\"; "
              "the last checkpoint loads; the restart refuses the file")

    # resume: auto skips a corrupt or tampered newest checkpoint for the one before.
    def corrupt_checkpoints(self):
        for damage in ("flip_weights", "edit_meta_step"):
            ckpt = os.path.join(self.work, damage)
            rc, out = self.run(damage, ["train.steps=4", "checkpoint.every=2", "checkpoint.keep=5",
                                        f"checkpoint.dir={ckpt}"])
            if rc != 0:
                fail(f"training the fixture failed:\n{out[-2000:]}")
            newest = os.path.join(ckpt, "step_00000004")
            if damage == "flip_weights":
                path = os.path.join(newest, "model.safetensors")
                with open(path, "r+b") as f:
                    f.seek(os.path.getsize(path) - 100)
                    b = f.read(1)
                    f.seek(-1, 1)
                    f.write(bytes([b[0] ^ 1]))
            else:
                path = os.path.join(newest, "meta.json")
                with open(path) as f:
                    text = f.read()
                with open(path, "w") as f:
                    f.write(text.replace('"step": 4', '"step": 5'))
            rc, out = self.run(damage + "_resume", ["train.steps=6", f"checkpoint.dir={ckpt}",
                                                    "checkpoint.resume=auto",
                                                    "logging.level=info"])
            if rc != 0 or "ignoring the latest checkpoint" not in out or \
                    "at step 2" not in out:
                fail(f"{damage}: resume did not fall back to step 2 (exit {rc}):\n{out[-2000:]}")
        print("a flipped weight byte and an edited meta.json: each falls back to the older step")


def catches(pid, sig):
    """Whether process pid has a handler for sig (its SigCgt mask)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(l.split()[1], 16) for l in f if l.startswith("SigCgt:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (int(sig) - 1) & 1)


def stopped_at(log):
    """Where a stopped run says it stopped, from its log."""
    for line in log.splitlines():
        if "stop signal received" in line:
            return line.split("stop signal received", 1)[1].strip(": ")
    return "ran to the end"


def losses(path):
    with open(path) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def main():
    pptrain, config, work, trial = sys.argv[1:5]
    work = os.path.join(work, trial)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    getattr(Trials(os.path.abspath(pptrain), config, work), trial)()
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
