#!/usr/bin/env bash
# Pipeline bubble and activation memory of every schedule, measured on CPU ranks.
# For pp in PPS (default 2 and 4), micro-batches m in 4, 8 and 16, and the schedules
# gpipe, 1f1b, interleaved (2 virtual stages; only where m is a multiple of pp), zb-h1 and
# zb-v (2 virtual stages), trains an 8-layer GPT for a few steps and prints one table row
# per configuration, each number the median over the timed steps (the first step is
# warm-up and not counted):
#   runs              how many runs the row chose from (see below)
#   bubble, min, max  the trainer's bubble metrics: mean, min and max over ranks of
#                     1 - compute / (the rank's own time in the pipeline schedule)
#   whole             idle / (compute + idle) of the mean rank, idle = wait_s + comm_s:
#                     also counts a rank's idle time after its last action, as sim does
#   sim               the trainer's bubble_theory: the simulated schedule, F = B = W = 1
#   sim@FBW           the trainer's bubble_sim: the schedule simulated with the step's
#                     measured F, B and W times
#   closed            the schedule's closed form (scripts/measure_bubble.py)
#   compute, idle     mean milliseconds per rank computing, and waiting or communicating
#   act, RSS          the most activation sets any rank held; the largest resident set
#   other             share of the machine's CPU time that other processes took
#                     during that run
# and then, for each (pp, m), zb-h1's and zb-v's idle time over 1f1b's beside the ZB
# paper's expectation for the forward (F), backward-input (B) and backward-weight (W)
# times measured in a traced step of that run: (F+B-W)/(F+B+W) for zb-h1, 1/3 when
# F = B = W, and (F+B-2W)/(F+B+W) for zb-v, 0 when F = B = W.
# Other processes on the machine slow a run down and distort its bubble, so each run
# records the CPU share they took while it ran. Each configuration runs REPEATS times;
# one whose best run still saw others take over MAX_OTHER of the CPU runs again, up to
# RETRIES more rounds while the sweep is within BUDGET seconds; its row shows the run
# that others disturbed least.
# A run that fails or hangs gets a FAILED row; its command and error go to stderr and
# the script exits 1 at the end.
# Usage: scripts/measure_bubble.sh [steps (default 10)]
#   PPTRAIN_BIN  the pptrain binary (default build/pptrain)
#   REPEATS      runs per configuration to begin with (default 2)
#   RETRIES      rounds of extra runs at most for disturbed configurations (default 3)
#   MAX_OTHER    CPU share of other processes that counts as disturbed (default 0.05)
#   BUDGET       seconds after which no retry round starts (default 420)
#   RUN_TIMEOUT  seconds before one run counts as hung (default 300)
#   PPS          the pipeline degrees to sweep (default "2 4")
#   WIDE=1       a wider model (d_model 512, 8 heads, seq_len 32) whose backward-weight
#                time comes closer to its forward time
#   SCHEDULE_COSTS  parallel.schedule_costs for every run, e.g. "[1, 1.1, 0.7]" (the F, B
#                and W times zb-v plans with and sim is simulated at; default [1, 1, 1])
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-10}
bin=${PPTRAIN_BIN:-build/pptrain}
repeats=${REPEATS:-2}
retries=${RETRIES:-3}
max_other=${MAX_OTHER:-0.05}
budget=${BUDGET:-420}
run_timeout=${RUN_TIMEOUT:-300}
pps=${PPS:-2 4}
[ -x "$bin" ] || { echo "$bin: not built (scripts/setup.sh, or set PPTRAIN_BIN)" >&2; exit 2; }
[ "$steps" -ge 2 ] || { echo "steps: need at least 2 (the first is warm-up)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
helper=scripts/measure_bubble.py
manifest=$work/manifest  # one line per run: pp m schedule v other-share metrics|FAILED why

# CPU ticks of the whole machine (busy, total) and of this script's finished children
# (pptrain waits for mpirun, which waits for the ranks, so theirs are counted).
machine_ticks() { head -1 /proc/stat | awk '{print $2+$3+$4+$7+$8+$9, $2+$3+$4+$5+$6+$7+$8+$9}'; }
own_ticks() { awk '{print $16 + $17}' "/proc/$$/stat"; }
read -r busy0 total0 < <(machine_ticks)
own0=$(own_ticks)
start=$(date +%s)

# The model: enough work per micro-batch (about 1.3 GFLOP for its 8 layers) that a
# stage's compute outweighs its 64 KiB activation messages, small enough that the sweep
# fits in minutes on two cores. Synthetic data has its own validation set, evaluated
# after the last step; eval_batches=1 keeps that short, and it runs after the step's
# metrics are taken, so it changes none of them. No checkpoints are written.
model=(--set model.n_layer=8 --set model.d_model=128 --set model.n_head=4
       --set model.seq_len=64 --set parallel.micro_batch_size=2 --set train.threads=1
       --set data.source=synthetic --set train.eval_every=0 --set train.eval_batches=1
       --set checkpoint.dir= --set logging.every=1 --set logging.level=warn)
if [ "${WIDE:-0}" = 1 ]; then
  model+=(--set model.d_model=512 --set model.n_head=8 --set model.seq_len=32)
fi
if [ -n "${SCHEDULE_COSTS:-}" ]; then model+=(--set "parallel.schedule_costs=$SCHEDULE_COSTS"); fi

# The CPU share other processes took since ticks "$1 $2 $3" (busy, total, own).
other_share() {
  local b t o
  read -r b t < <(machine_ticks)
  o=$(own_ticks)
  awk -v b=$((b - $1)) -v t=$((t - $2)) -v o=$((o - $3)) 'BEGIN { x = t > 0 ? (b - o) / t : 0; printf "%.3f", (x > 0 ? x : 0) }'
}

failures=0
runs=0
run_one() {  # pp m schedule: one run, recorded in the manifest
  local pp=$1 m=$2 sched=$3 v=1 rc=0 b0 t0 o0
  case $sched in interleaved | zb-v) v=2 ;; esac
  runs=$((runs + 1))
  local metrics="$work/run$runs.jsonl"
  local cmd=("$bin" --config configs/tiny.yaml "${model[@]}" --set train.steps="$steps"
             --set parallel.pp="$pp" --set parallel.micro_batches="$m"
             --set parallel.schedule="$sched" --set parallel.virtual_stages="$v"
             --set logging.metrics="$metrics")
  # zb-h1 and zb-v are judged against their measured forward, backward-input and
  # backward-weight times: one timed step of each is traced.
  case $sched in zb-h1 | zb-v) cmd+=(--set logging.trace="${metrics%.jsonl}.trace.json"
                                     --set "logging.trace_steps=[2]") ;; esac
  read -r b0 t0 < <(machine_ticks)
  o0=$(own_ticks)
  timeout -k 10 "$run_timeout" "${cmd[@]}" </dev/null >"$work/out" 2>&1 || rc=$?
  local other
  other=$(other_share "$b0" "$t0" "$o0")
  if [ "$rc" -eq 0 ] && [ -s "$metrics" ]; then
    echo "$pp $m $sched $v $other $metrics" >>"$manifest"
  else
    failures=$((failures + 1))
    local why="exit $rc"
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then why="no exit within ${run_timeout} s, killed"; fi
    echo "$pp $m $sched $v $other FAILED $why" >>"$manifest"
    { echo "FAILED ($why): ${cmd[*]}"; tail -n 20 "$work/out"; } >&2
  fi
}

for pp in $pps; do
  for m in 4 8 16; do
    for sched in gpipe 1f1b interleaved zb-h1 zb-v; do
      if [ "$sched" = interleaved ] && [ $((m % pp)) -ne 0 ]; then continue; fi
      for _ in $(seq "$repeats"); do run_one "$pp" "$m" "$sched"; done
    done
  done
done
for _ in $(seq "$retries"); do
  [ $(($(date +%s) - start)) -lt "$budget" ] || break
  again=$(python3 "$helper" disturbed "$manifest" "$max_other")
  [ -n "$again" ] || break
  while read -r pp m sched; do run_one "$pp" "$m" "$sched"; done <<<"$again"
done

echo "pptrain pipeline bubble sweep: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')), $(date -u -d "@$start" '+%F %H:%M UTC')"
if [ "${WIDE:-0}" = 1 ]; then shape="d_model 512, 8 heads, seq_len 32"; else shape="d_model 128, 4 heads, seq_len 64"; fi
echo "model: 8 layers, $shape, micro-batch 2 sequences, 1 thread per rank, synthetic data; schedule_costs ${SCHEDULE_COSTS:-[1, 1, 1]}"
echo "$steps steps per run, medians of steps 2..$steps; of $runs runs, each row shows its configuration's least disturbed"
echo
python3 "$helper" report "$manifest"
read -r busy1 total1 < <(machine_ticks)
own1=$(own_ticks)
awk -v b=$((busy1 - busy0)) -v t=$((total1 - total0)) -v o=$((own1 - own0)) \
    -v s=$(($(date +%s) - start)) 'BEGIN {
  printf "%d s; CPU during the sweep: %.0f%% busy, this sweep %.0f%%, other processes %.0f%%\n",
         s, 100 * b / t, 100 * o / t, (b > o ? 100 * (b - o) / t : 0) }'
[ "$failures" -eq 0 ] || { echo "$failures run(s) failed" >&2; exit 1; }
