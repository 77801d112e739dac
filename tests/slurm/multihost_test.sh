#!/usr/bin/env bash
# The multi-node example across hosts of their own: slurm_cluster.sh start-hosts makes
# HOSTS network namespaces, each with its own hostname, address and slurmd, so that
# Open MPI sees HOSTS hosts and its messages between them cross a network transport.
#
#   multihost_test.sh HOSTS PPTRAIN SOURCE_DIR [PPTRAIN_EMULATED]
#
# Submits scripts/slurm/multinode.sbatch on HOSTS hosts x 2 ranks: tp 2 inside a host,
# pp 2 across hosts, dp HOSTS/2. Checks that the job completes; that every rank sends
# to the ranks of its own host through shared memory (vader) and to the others through
# TCP, from Open MPI's own log (btl_base_verbose); and that the losses are the one-rank
# run's (first step 1e-6 relative, every step 1e-4). Pipeline messages are 64 KiB a
# rank, and Open MPI's shared-memory and TCP eager limits are forced down to 4 KiB, so
# no message is buffered. With PPTRAIN_EMULATED (pptrain-emulated), the same layout
# runs again on emulated GPUs, NCCL between the hosts' processes, against the CPU. On 2
# hosts also: a cut link, a lost host, and a checkpoint directory that jobs on both
# hosts share.
# Exit status 0 pass, 1 fail, 77 skipped (not root, or no Slurm and it cannot be
# installed).
set -euo pipefail
SKIP=77
[[ $# -eq 3 || $# -eq 4 ]] ||
  { echo "usage: $0 HOSTS PPTRAIN SOURCE_DIR [PPTRAIN_EMULATED]" >&2; exit 2; }
hosts=$1
pptrain=$(realpath "$2")
src=$(realpath "$3")
emulated=${4:+$(realpath "$4")}
here=$(cd "$(dirname "$0")" && pwd)
((hosts % 2 == 0)) || { echo "HOSTS must be even (pp 2)" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/pptrain-multihost.XXXXXX")
cluster=$work/cluster
cleanup() { "$here/slurm_cluster.sh" stop "$cluster" || true; rm -rf "$work"; }
trap cleanup EXIT
trap 'exit 1' TERM INT HUP  # a ctest timeout too: the namespaces and daemons go
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/job*/*.out "$work"/job*/*.err "$cluster"/log/slurm*.log; do
    [[ -f $f ]] && { echo "--- $f (last 30 lines)" >&2; tail -n 30 "$f" >&2; }
  done
  exit 1
}

set +e
SLURM_TEST_CRED_EXPIRE=5 "$here/slurm_cluster.sh" start-hosts "$cluster" "$hosts"
rc=$?
set -e
[[ $rc -eq 0 ]] || { [[ $rc -eq $SKIP ]] && exit $SKIP; fail "the test cluster did not start"; }
# shellcheck disable=SC1091
source "$cluster/env"

steps=10
# 8 sequences a step; a pipeline message is 2 x 128 x 128 fp32 = 128 KiB, 64 KiB a tp rank.
model=(--set model.n_layer=4 --set model.n_head=4 --set model.d_model=128
       --set model.seq_len=128 --set parallel.micro_batch_size=2
       --set parallel.micro_batches=$((8 / (2 * hosts / 2))) --set train.steps=$steps
       --set train.threads=1 --set train.eval_every=0 --set logging.every=1
       --set parallel.comm_timeout_s=60)

# submit_job NAME BINARY [--set ...]: multinode.sbatch on every host; prints the job id.
# dp is PPTRAIN_DP when set, else HOSTS / 2 (pp 2 across the hosts).
submit_job() {
  local name=$1 binary=$2; shift 2
  local dir=$work/$name
  mkdir -p "$dir"
  (cd "$src" && OMPI_MCA_btl_base_verbose=100 OMPI_MCA_btl_vader_eager_limit=4096 \
    OMPI_MCA_btl_tcp_eager_limit=4096 PPTRAIN_DP=${PPTRAIN_DP:-$((hosts / 2))} sbatch --parsable \
    --cpus-per-task=1 --time=5 --chdir="$dir" --nodes="$hosts" --ntasks-per-node=2 \
    --gres=none --export=ALL,PPTRAIN="$binary" scripts/slurm/multinode.sbatch \
    "$src/configs/tiny.yaml" "${model[@]}" --set logging.metrics="$dir/metrics.jsonl" \
    --set checkpoint.dir="$dir/ckpt" "$@") || fail "sbatch refused $name"
}

# wait_job NAME ID: until the job ends; it must have completed.
wait_job() {
  local name=$1 id=$2 dir=$work/$1
  local deadline=$((SECONDS + 150)) state
  while :; do
    state=$(scontrol -o show job "$id" 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p')
    case $state in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;;
    esac
    ((SECONDS < deadline)) || fail "$name: job $id still $state after 150 s"
    sleep 0.2
  done
  [[ $state == COMPLETED ]] || fail "$name: job $id ended $state"
  cat "$dir"/*-"$id".err >"$dir/err.log"
}

run_job() { local id; id=$(submit_job "$@") || exit 1; wait_job "$1" "$id"; }

# pptrain processes left on the hosts.
ranks_alive() {
  local i pid n=0
  for ((i = 1; i <= hosts; i++)); do
    for pid in $("$here/slurm_cluster.sh" host-pids "$cluster" "node$i"); do
      [[ $(cat "/proc/$pid/comm" 2>/dev/null) == pptrain* ]] && n=$((n + 1))
    done
  done
  echo "$n"
}

# transports LOG: every "Using BTL btl for send to [[job,step],R] on node N" line of a
# process on host H says vader (N = H, another rank), self (itself) or tcp (N != H).
check_transports() {
  python3 - "$1" "$hosts" <<'EOF' || fail "transports: see above"
import re, sys
seen = {"vader": 0, "tcp": 0}
bad = []
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\[(\S+?):\d+\] mca: bml: Using (\w+) btl for send to \S+ on node (\S+)", line)
    if not m:
        continue
    here, btl, there = m.groups()
    if btl == "self":
        continue
    want = "vader" if here == there else "tcp"
    if btl != want:
        bad.append(line.strip())
    seen[btl] = seen.get(btl, 0) + 1
hosts = int(sys.argv[2])
if bad or seen["vader"] == 0 or seen["tcp"] == 0:
    sys.exit(f"expected vader inside a host and tcp across hosts; got {seen}, e.g. {bad[:3]}")
print(f"transports: {seen['vader']} vader (inside a host), {seen['tcp']} tcp (across hosts)")
EOF
}

# same_losses METRICS REFERENCE BOUND_FIRST BOUND_ALL
same_losses() {
  python3 - "$@" <<'EOF' || fail "losses differ from the one-rank run"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
first, every = float(sys.argv[3]), float(sys.argv[4])
rel = [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows, ref)]
if len(rows) != len(ref) or rel[0] > first or max(rel) > every:
    sys.exit(f"{len(rows)} steps against {len(ref)}; first {rel[0]:.1e}, worst {max(rel):.1e}")
print(f"losses: {len(rows)} steps, first {rel[0]:.1e}, worst {max(rel):.1e} relative")
EOF
}

# one_rank NAME [--set ...]: the one-rank CPU run of the same global batch.
one_rank() {
  local name=$1; shift
  mkdir -p "$work/$name"
  "$pptrain" --config "$src/configs/tiny.yaml" "${model[@]}" "$@" --set parallel.micro_batches=4 \
    --set logging.metrics="$work/$name/metrics.jsonl" --set checkpoint.dir= \
    >"$work/$name/log" 2>&1 || fail "the one-rank run $name failed: $(tail -n 5 "$work/$name/log")"
}

one_rank single

run_job job_cpu "$pptrain"
check_transports "$work/job_cpu/err.log"
same_losses "$work/job_cpu/metrics.jsonl" "$work/single/metrics.jsonl" 1e-6 1e-4
grep -q "layout tp 2 pp 2 dp $((hosts / 2))" "$work"/job_cpu/*.out || fail "not the layout tp 2 pp 2"

if [[ -n $emulated ]]; then
  # The emulator runs a GPU's threads one by one: a smaller model, in fp32.
  small=(--set model.d_model=32 --set model.n_head=2 --set model.seq_len=16
         --set train.precision=fp32)
  one_rank single_small "${small[@]}"
  PPTRAIN_EMULATED_GPUS=2 run_job job_emulated "$emulated" "${small[@]}" --set device=cuda
  same_losses "$work/job_emulated/metrics.jsonl" "$work/single_small/metrics.jsonl" 1e-5 1e-5
fi
# A cut link: host 2's link goes down mid-run, so TCP gets no reset and just stops. Every
# rank must end within parallel.comm_timeout_s plus the abort's grace, with a line naming
# rank, group and operation. With the link back, the job resumes from the last
# checkpoint and its losses and gradient norms are the uninterrupted run's, bit for bit.
if ((hosts == 2)); then
  timeout=8
  long=(--set model.d_model=32 --set model.seq_len=16 --set train.steps=600
        --set checkpoint.every=20 --set parallel.comm_timeout_s=$timeout)
  run_job job_whole "$pptrain" "${long[@]}"

  # wait_for_step NAME: until job NAME has saved step 100.
  wait_for_step() {
    local deadline=$((SECONDS + 60))
    until [[ -d $work/$1/ckpt/step_00000100 ]]; do
      ((SECONDS < deadline)) || fail "$1 saved no step 100 within 60 s"
      sleep 0.1
    done
  }
  # ranks_end WHAT: until no rank is left, at most the timeout and 10 s; sets `took`.
  ranks_end() {
    local since=$SECONDS
    until (($(ranks_alive) == 0)); do
      ((SECONDS - since <= timeout + 10)) ||
        fail "ranks still alive $((SECONDS - since)) s after $1"
      sleep 0.2
    done
    took=$((SECONDS - since))
  }
  # timeout_line NAME: the job's line naming rank, group and operation, and the peers
  # that did not answer the liveness check (a rank waiting on a live peer that is stuck
  # elsewhere prints "every peer answered" instead: the other lines). Call it as
  # `x=$(...) || exit 1`: fail only ends the command substitution.
  timeout_line() {
    local line
    line=$(grep -h "did not complete within $timeout s" "$work"/$1/*.err |
      grep "no answer within" | head -n 1)
    [[ $line =~ rank\ [0-9]+:\ .*\ on\ group\ .*no\ answer\ within\ 1\ s\ from\ [0-9,]+\) ]] ||
      fail "$1: no line names rank, group, operation and the silent peers: $line"
    echo "$line"
  }
  # same_as_whole NAME [WHOLE]: each step's last logged row (a step run again after a
  # resume counts once, its second run) equals the uninterrupted run WHOLE's (default
  # job_whole), steps contiguous to 600.
  same_as_whole() {
    python3 - "$work/$1/metrics.jsonl" "$work/${2:-job_whole}/metrics.jsonl" <<'EOF' ||
import json, sys
last = {}
for r in map(json.loads, open(sys.argv[1])):
    last[r["step"]] = r
whole = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
steps = sorted(last)
same = steps == list(range(steps[0], 601)) if steps else False
same = same and all(last[s]["loss"] == whole[s]["loss"] and
                    last[s]["grad_norm"] == whole[s]["grad_norm"] for s in steps)
if not same:
    sys.exit(f"steps {steps[:1]}..{steps[-1:]}: not the uninterrupted run's")
print(f"steps {steps[0]}..600 bit-identical to the uninterrupted run")
EOF
      fail "$1 differs from the uninterrupted run"
  }

  # Not requeued: the resume below is checked on its own.
  id=$(PPTRAIN_MAX_REQUEUES=0 submit_job job_cut "$pptrain" "${long[@]}") || exit 1
  wait_for_step job_cut
  "$here/slurm_cluster.sh" link "$cluster" node2 down
  ranks_end "the link went down"
  "$here/slurm_cluster.sh" link "$cluster" node2 up
  scancel "$id" 2>/dev/null || true
  line=$(timeout_line job_cut) || exit 1
  echo "cut link: every rank ended within ${took} s: $line"
  run_job job_resumed "$pptrain" "${long[@]}" --set checkpoint.dir="$work/job_cut/ckpt" \
    --set checkpoint.resume=auto
  same=$(same_as_whole job_resumed) || exit 1
  echo "cut link, resumed: $same"
fi
# A lost node: every process of host 2 (its slurmd too) killed mid-run. The layout is
# dp 2 across the hosts (tp 2 inside, pp 1), so the ranks on host 1 wait in collectives
# of both hosts. They end within parallel.comm_timeout_s plus the abort's grace, exit 3,
# naming host 2's ranks (2, 3) as the peers that did not answer; train.sbatch requeues
# the job; host 2 comes back (rebooted); the requeued job resumes from the last
# checkpoint and ends with the uninterrupted run's losses and gradient norms, bit for bit.
if ((hosts == 2)); then
  across=(--set parallel.micro_batches=2)
  PPTRAIN_DP=2 run_job job_whole_dp "$pptrain" "${long[@]}" "${across[@]}"
  id=$(PPTRAIN_DP=2 submit_job job_lost "$pptrain" "${long[@]}" "${across[@]}") || exit 1
  wait_for_step job_lost
  "$here/slurm_cluster.sh" kill-host "$cluster" node2
  ranks_end "host 2 died"
  "$here/slurm_cluster.sh" revive-host "$cluster" node2
  wait_job job_lost "$id"
  restarts=$(scontrol -o show job "$id" | tr ' ' '\n' | sed -n 's/^Restarts=//p')
  [[ $restarts == 1 ]] || fail "job_lost: $restarts restarts, expected 1"
  grep -q "resumed from .*step_" "$work"/job_lost/*.out || fail "job_lost did not resume"
  line=$(timeout_line job_lost) || exit 1
  silent=$(grep -h "no answer within" "$work"/job_lost/*.err)
  ! grep -Eqv 'from (2|3|2,3)\)' <<<"$silent" ||
    fail "job_lost: a rank of host 1 was named silent: $silent"
  same=$(same_as_whole job_lost job_whole_dp) || exit 1
  echo "lost host: its peers ended within ${took} s ($line); requeued, resumed: $same"
fi
# One checkpoint directory on storage both hosts share: a job on host 2 is refused while
# a job on host 1 holds it (K24, exit 2, naming host 1).
if ((hosts == 2)); then
  mkdir -p "$work/lock_a" "$work/lock_b"
  shared=(--set train.steps=100000 --set train.threads=1 --set checkpoint.every=50
          --set checkpoint.dir="$work/lock_ckpt" --set parallel.pp=2)
  id_a=$(sbatch --parsable --nodelist=node1 --ntasks=2 --cpus-per-task=1 --time=5 \
    --chdir="$work/lock_a" --export=ALL,PPTRAIN="$pptrain" "$src/scripts/slurm/train.sbatch" \
    "$src/configs/tiny.yaml" "${shared[@]}") || fail "sbatch refused lock_a"
  deadline=$((SECONDS + 60))
  until [[ -d $work/lock_ckpt/step_00000050 ]]; do
    ((SECONDS < deadline)) || fail "lock_a saved no checkpoint within 60 s"
    sleep 0.1
  done
  id_b=$(sbatch --parsable --nodelist=node2 --ntasks=2 --cpus-per-task=1 --time=5 \
    --chdir="$work/lock_b" --export=ALL,PPTRAIN="$pptrain" "$src/scripts/slurm/train.sbatch" \
    "$src/configs/tiny.yaml" "${shared[@]}") || fail "sbatch refused lock_b"
  deadline=$((SECONDS + 60))
  until [[ $(scontrol -o show job "$id_b" | tr ' ' '\n' | sed -n 's/^JobState=//p') =~ ^(FAILED|COMPLETED|CANCELLED)$ ]]; do
    ((SECONDS < deadline)) || fail "lock_b still runs beside lock_a"
    sleep 0.2
  done
  scancel "$id_a"
  refused=$(grep -h "in use by another run (host node1" "$work"/lock_b/*.err | head -n 1)
  exit_b=$(scontrol -o show job "$id_b" | tr ' ' '\n' | sed -n 's/^ExitCode=//p')
  [[ -n $refused && $exit_b == 2:0 ]] || fail "lock_b was not refused (exit $exit_b)"
  echo "shared checkpoint dir: the job on node2 was refused (exit 2): $refused"
fi
echo "PASS: $hosts hosts x 2 ranks"
