"""Starting, watching and stopping pptrain jobs for the reliability trials.

Every job runs in a session (and process group) of its own, and cleanup kills only that
group and the processes descended from the job, so trials never touch anything else on
the machine."""
import os
import signal
import subprocess
import sys
import time

# Open MPI refuses root without these; the trials may run as root (CI does).
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def fail(message):
    sys.exit("FAIL: " + message)


def overrides(settings):
    args = []
    for s in settings:
        args += ["--set", s]
    return args


class Job:
    """A pptrain command running in its own session; output collected to a file."""

    def __init__(self, argv, log_path):
        self.argv = argv
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.pid = self.proc.pid

    def wait(self, timeout):
        """The exit code, or fail() if the job is still running after `timeout` s."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            fail(f"{' '.join(self.argv)} did not end within {timeout} s")

    def output(self):
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def descendants(self):
        return [p for p in live_pids() if descends_from(p, self.pid) and p != self.pid]

    def kill(self):
        """SIGKILL to the job's group and every process it started."""
        victims = self.descendants()
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


def stat_fields(pid):
    """(state, parent pid) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, ValueError, IndexError):
        return None


def alive(pid):
    """Running: not gone and not a zombie waiting to be reaped."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def live_pids():
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and alive(int(p))]


def descends_from(pid, ancestor):
    while pid > 1:
        if pid == ancestor:
            return True
        fields = stat_fields(pid)
        if fields is None:
            return False
        pid = fields[1]
    return False


def rank_pids(job, rank):
    """PIDs of the job's processes that are MPI rank `rank`."""
    pids = []
    for pid in job.descendants():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"pptrain" in cmd and f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            pids.append(pid)
    return pids


def wait_for(predicate, what, limit=120):
    deadline = time.time() + limit
    while not predicate():
        if time.time() > deadline:
            fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def wait_for_path(path, limit=120):
    wait_for(lambda: os.path.exists(path), path, limit)
