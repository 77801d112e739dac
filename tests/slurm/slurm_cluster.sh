#!/usr/bin/env bash
# A throw-away Slurm cluster on this machine, for testing the sbatch scripts.
#
#   slurm_cluster.sh start DIR [NODES]  install Debian's slurm/munge if missing (root
#                                       only), then start munged, slurmctld and one
#                                       slurmd per node (default 1), with everything
#                                       (key, sockets, config, state, logs) under DIR;
#                                       waits until every node is idle and writes
#                                       DIR/env to source (it sets SLURM_CONF)
#   slurm_cluster.sh start-hosts DIR [NODES]
#                                       the same, but each node a host of its own: a
#                                       network namespace with its own hostname (a UTS
#                                       namespace) and address on a private bridge, and
#                                       its slurmd in them; traffic between the nodes
#                                       crosses the bridge (veth pairs), as between hosts
#   slurm_cluster.sh stop DIR           cancel the jobs, stop the daemons started from
#                                       DIR, remove the hosts' namespaces, bridge and
#                                       links, and delete DIR
#   slurm_cluster.sh host-pids DIR NODE the pids of every process on host NODE (hosts
#                                       only): its slurmd and all it started
#   slurm_cluster.sh link DIR NODE up|down
#                                       bring host NODE's link up or down (hosts only)
#   slurm_cluster.sh kill-host DIR NODE SIGKILL to every process on host NODE, its slurmd
#                                       included (hosts only)
#   slurm_cluster.sh revive-host DIR NODE
#                                       host NODE rebooted: its TmpFS and the dead step
#                                       daemons' PMIx sockets gone, its slurmd started
#
# Nothing outside DIR is written except by apt-get when it installs the packages: the
# daemons get their config with -f and the clients through SLURM_CONF. Nodes are named
# node1..nodeN, all on this host (127.0.0.1), each slurmd on its own port and with its
# own spool and TmpFS (PMIx keeps per-step files there, which two slurmds on one host
# must not share). Each node claims 8 CPUs whatever the machine has
# (SlurmdParameters=config_overrides), so multi-rank CPU jobs fit on a small machine.
# Exit status 77: cannot run here (not root, or Slurm is missing and cannot be
# installed); the tests report that as skipped. A daemon that will not start is a
# failure (exit 1); `stop` also cleans up after a failed start.
set -euo pipefail

SKIP=77
PKGS=(slurmctld slurmd slurm-client munge)
CRED_EXPIRE=${SLURM_TEST_CRED_EXPIRE:-10}

die() { echo "slurm_cluster: $*" >&2; exit 1; }
skip() { echo "slurm_cluster: SKIP: $*" >&2; exit "$SKIP"; }

have_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
    command -v sbatch >/dev/null && command -v munged >/dev/null
}

install_packages() {
  have_packages && return 0
  [[ $(id -u) -eq 0 ]] || skip "Slurm is not installed and installing it needs root: apt-get install ${PKGS[*]}"
  command -v apt-get >/dev/null || skip "Slurm is not installed and there is no apt-get"
  echo "slurm_cluster: installing ${PKGS[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PKGS[@]}" \
    >"$1/apt.log" 2>&1 || { tail -n 5 "$1/apt.log" >&2; skip "apt-get install ${PKGS[*]} failed"; }
  have_packages || skip "apt-get installed ${PKGS[*]} but the daemons are not on PATH"
}

free_ports() {  # free_ports N: N distinct free TCP ports on 127.0.0.1
  python3 - "$1" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

# Hosts mode: node i is network namespace $NET-node$i, linked by the veth pair $NET-v$i /
# eth0 to the bridge $NET-br; the bridge (this host, where slurmctld runs) is $SUBNET.1,
# node i $SUBNET.$((10 + i)). Two clusters at once need their own SLURM_TEST_NET (at
# most 9 characters) and SLURM_TEST_SUBNET; DIR/hosts records both for the commands below.
NET=${SLURM_TEST_NET:-pptrain}
SUBNET=${SLURM_TEST_SUBNET:-10.77.0}
node_addr() { echo "$SUBNET.$((10 + $1))"; }
load_hosts() {  # load_hosts DIR: NET and SUBNET of the cluster in DIR; false if not hosts
  [[ -f $1/hosts ]] || return 1
  # shellcheck disable=SC1091
  source "$1/hosts"
}

make_hosts() {
  local nodes=$1 i ns
  ip link add "$NET-br" type bridge || die "cannot make the bridge $NET-br (one left over?)"
  ip addr add "$SUBNET.1/24" dev "$NET-br"
  ip link set "$NET-br" up
  for ((i = 1; i <= nodes; i++)); do
    ns=$NET-node$i
    ip netns add "$ns" || die "cannot make the network namespace $ns"
    ip link add "$NET-v$i" type veth peer name eth0 netns "$ns"
    ip link set "$NET-v$i" master "$NET-br" up
    ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "$SUBNET.1"
  done
}

remove_hosts() {
  local ns pid link
  for ns in $(ip netns list 2>/dev/null | awk -v p="^$NET-node" '$1 ~ p {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  # A veth pair goes with its namespace, but the kernel may take a moment: not left for
  # the next cluster to trip over.
  for link in $(ip -o link show 2>/dev/null | sed -n "s/^[0-9]*: \($NET-v[0-9]*\)@.*/\1/p"); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$NET-br" 2>/dev/null || true
}

write_conf() {
  local dir=$1 host=$2 user=$3 nodes=$4 hosts=$5
  local -a ports
  read -r -a ports <<<"$(free_ports $((nodes + 1)))"
  local ctl_addr=127.0.0.1
  ((hosts)) && ctl_addr=$SUBNET.1
  cat >"$dir/slurm.conf" <<EOF
# Test cluster of $nodes node(s) on one machine; everything lives under $dir.
ClusterName=pptrain-test
SlurmctldHost=$host($ctl_addr)
SlurmctldPort=${ports[0]}
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire also sets how long a requeued job waits before it may start (default 120 s).
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=$CRED_EXPIRE
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
PlugStackConfig=$dir/plugstack.conf
TmpFS=$dir/tmp/node1
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/jobcomp.txt
SchedulerType=sched/builtin
# Look at pending jobs every second: a requeued job starts as soon as it may.
SchedulerParameters=sched_interval=1
ReturnToService=2
MinJobAge=600
KillWait=10
InactiveLimit=0
EOF
  # A host that stops answering is down after 10 s (the default is 300 s), and its jobs
  # are requeued.
  ((hosts)) && echo "SlurmdTimeout=10" >>"$dir/slurm.conf"
  local i
  for ((i = 1; i <= nodes; i++)); do
    if ((hosts)); then
      echo "NodeName=node$i NodeHostname=node$i NodeAddr=$(node_addr "$i") Port=${ports[i]} CPUs=8 RealMemory=4096 State=UNKNOWN"
    else
      echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=${ports[i]} CPUs=8 RealMemory=4096 State=UNKNOWN"
    fi
  done >>"$dir/slurm.conf"
  echo "PartitionName=debug Nodes=node[1-$nodes] Default=YES MaxTime=INFINITE OverSubscribe=YES State=UP" \
    >>"$dir/slurm.conf"
  # Each slurmd reads a copy that differs only in TmpFS.
  for ((i = 1; i <= nodes; i++)); do
    mkdir -p "$dir/tmp/node$i" "$dir/spool/node$i"
    sed "s|^TmpFS=.*|TmpFS=$dir/tmp/node$i|" "$dir/slurm.conf" >"$dir/slurmd-node$i.conf"
  done
  : >"$dir/plugstack.conf"
}

wait_for() {  # wait_for SECONDS CMD...: retry CMD every 0.2 s
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}

all_idle() {  # all_idle N: sinfo lists N nodes, all idle
  local states
  states=$(sinfo -h -N -o '%t' 2>/dev/null | sort | uniq -c | awk '{print $1, $2}')
  [[ $states == "$1 idle" ]]
}

# start_slurmd DIR I HOSTS: node I's slurmd; with HOSTS, in the node's network namespace
# under its own hostname (nsenter, not `ip netns exec`, which mounts a /sys of its own,
# without the cgroup tree slurmd reads).
start_slurmd() {
  local dir=$1 i=$2 hosts=$3
  if ((hosts)); then
    nsenter --net="/run/netns/$NET-node$i" unshare --uts /bin/sh -c \
      "hostname node$i && exec slurmd -f '$dir/slurmd-node$i.conf' -N node$i"
  else
    slurmd -f "$dir/slurmd-node$i.conf" -N "node$i"
  fi || die "slurmd for node$i would not start (see $dir/log/slurmd-node$i.log)"
}

start() {
  local dir=$1 nodes=$2 hosts=$3
  [[ $nodes =~ ^[1-9][0-9]*$ ]] || die "NODES must be a positive integer, not '$nodes'"
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  install_packages "$dir"
  [[ $(id -u) -eq 0 ]] || skip "slurmd must run as root to start jobs"
  mkdir -p "$dir"/{munge,state,spool,log,tmp}
  chmod 700 "$dir/munge"

  # munged insists on a private key file and socket directory.
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 600 "$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munged.seed" ||
    die "munged would not start (see $dir/log/munged.log)"
  wait_for 10 test -S "$dir/munge/munge.socket" || die "munged made no socket (see $dir/log/munged.log)"

  if ((hosts)); then
    command -v ip >/dev/null && command -v unshare >/dev/null && command -v nsenter >/dev/null ||
      skip "hosts need ip, unshare and nsenter"
    unshare --net --uts true 2>/dev/null ||
      skip "this machine refuses network namespaces (a container without CAP_SYS_ADMIN?)"
    echo "NET=$NET SUBNET=$SUBNET" >"$dir/hosts"
    make_hosts "$nodes"
  fi
  write_conf "$dir" "$(hostname -s)" "$(id -un)" "$nodes" "$hosts"
  echo "export SLURM_CONF=$dir/slurm.conf" >"$dir/env"
  export SLURM_CONF=$dir/slurm.conf

  slurmctld -f "$SLURM_CONF" -i || die "slurmctld would not start (see $dir/log/slurmctld.log)"
  wait_for 20 scontrol ping || die "slurmctld does not answer (see $dir/log/slurmctld.log)"
  local i
  for ((i = 1; i <= nodes; i++)); do start_slurmd "$dir" "$i" "$hosts"; done
  if ! wait_for 30 all_idle "$nodes"; then
    sinfo -N -l >&2 || true
    tail -n 20 "$dir"/log/*.log >&2 || true
    die "the nodes did not become idle (logs in $dir/log)"
  fi
  echo "slurm_cluster: $nodes node(s) idle; source $dir/env to use them" >&2
}

kill_pidfiles() {  # kill_pidfiles FILE...: TERM the daemons named there, wait for them
  local f pid pids=()
  for f in "$@"; do
    [[ -s $f ]] || continue
    pid=$(<"$f")
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

stop() {
  local dir=$1
  [[ -d $dir ]] || return 0
  # Cancel what still runs so no job step outlives its slurmd.
  if [[ -f $dir/slurm.conf ]] && SLURM_CONF=$dir/slurm.conf scontrol ping >/dev/null 2>&1; then
    SLURM_CONF=$dir/slurm.conf scancel --user="$(id -un)" 2>/dev/null || true
    local deadline=$((SECONDS + 15))
    while [[ -n $(SLURM_CONF=$dir/slurm.conf squeue -h -t RUNNING,COMPLETING 2>/dev/null) ]] &&
      ((SECONDS < deadline)); do sleep 0.2; done
  fi
  # The slurmds first (they end the job steps they run), then slurmctld, then munged.
  kill_pidfiles "$dir"/slurmd-*.pid
  kill_pidfiles "$dir/slurmctld.pid"
  kill_pidfiles "$dir/munge/munged.pid"
  load_hosts "$dir" && remove_hosts
  rm -rf "$dir"
}

case ${1:-} in
  start) [[ $# -eq 2 || $# -eq 3 ]] || die "usage: $0 start DIR [NODES]"; start "$2" "${3:-1}" 0 ;;
  start-hosts)
    [[ $# -eq 2 || $# -eq 3 ]] || die "usage: $0 start-hosts DIR [NODES]"
    start "$2" "${3:-2}" 1 ;;
  stop) [[ $# -eq 2 ]] || die "usage: $0 stop DIR"; stop "$2" ;;
  host-pids)
    [[ $# -eq 3 ]] || die "usage: $0 host-pids DIR NODE"
    load_hosts "$2" || die "$2 is not a cluster of hosts"
    ip netns pids "$NET-$3" ;;
  kill-host)  # the host dies: SIGKILL to every process on it, its slurmd included
    [[ $# -eq 3 ]] || die "usage: $0 kill-host DIR NODE"
    load_hosts "$2" || die "$2 is not a cluster of hosts"
    for pid in $(ip netns pids "$NET-$3"); do kill -KILL "$pid" 2>/dev/null || true; done ;;
  revive-host)  # the host is back, rebooted: an empty TmpFS, its slurmd again
    [[ $# -eq 3 ]] || die "usage: $0 revive-host DIR NODE"
    load_hosts "$2" || die "$2 is not a cluster of hosts"
    find "$2/tmp/$3" -mindepth 1 -delete
    # The killed step daemons' PMIx sockets: the requeued job's step has the same id.
    rm -rf "$2/spool/$3"/pmix.* "$2/spool/$3"/stepd.slurm.pmix.*
    start_slurmd "$(cd "$2" && pwd)" "${3#node}" 1 ;;
  link)
    [[ $# -eq 4 && $4 =~ ^(up|down)$ ]] || die "usage: $0 link DIR NODE up|down"
    load_hosts "$2" || die "$2 is not a cluster of hosts"
    ip link set "$NET-v${3#node}" "$4" ;;
  *) die "usage: $0 start|start-hosts DIR [NODES] | stop DIR |" \
       "host-pids|kill-host|revive-host DIR NODE | link DIR NODE up|down" ;;
esac
