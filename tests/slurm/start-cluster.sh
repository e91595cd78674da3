#!/usr/bin/env bash
# A one-node SLURM on this machine, for tests/test_slurm.py and for trying `./run_all.sh slurm`:
# munged, slurmctld and slurmd started directly (no systemd: this runs in containers too), no
# cgroups, no accounting. Needs root and Debian's packages: apt-get install slurm-wlm munge.
#   tests/slurm/start-cluster.sh          start what is not running; wait until the node is idle
#   tests/slurm/start-cluster.sh --stop   stop the daemons this script started (munged only if it
#                                         started it), leaving a cluster of its own alone
# A second call with everything running does nothing. tests/test_slurm.py stops what it started
# when the test session ends, unless SSA_KIT_KEEP_SLURM=1 keeps it for the next run (CI, or a
# developer rerunning the test). State and logs: $SLURM_TEST_STATE
# (default /var/lib/ssa-kit-slurm). The config is /etc/slurm/slurm.conf (where sbatch and squeue
# look), written only if absent or written here before (its first line says so; a changed one
# restarts the daemons), never over a cluster's own.
set -euo pipefail
STATE=${SLURM_TEST_STATE:-/var/lib/ssa-kit-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by ssa-kit tests/slurm/start-cluster.sh"

die() { echo "start-cluster: $*" >&2; exit 1; }

# wait_for SECONDS WHAT COMMAND...: poll until COMMAND succeeds
wait_for() {
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq $((seconds * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  die "$what did not come up in ${seconds}s (logs in $STATE)"
}

conf_text() {
  # this machine as slurmd sees it (CPUs, sockets, cores, memory), reachable on the loopback
  local node host
  node=$(slurmd -C | head -1)
  host=$(hostname -s)
  cat <<CONF
$MARK
ClusterName=ssakit
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
# no cgroups (containers rarely delegate them): processes are tracked by their parents
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# CPUs are the consumable; memory is not, so array tasks share the node's memory
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# a requeued job waits cred_expire + 1 s before it may start again (default 120 s) and pending
# jobs are looked at every sched_interval s (default 60): seconds here, so tests stay short
AuthInfo=cred_expire=5
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=none
JobRequeue=1
# finished jobs leave squeue after 2 s; a node that went away comes back by itself
MinJobAge=2
ReturnToService=2
KillWait=30
$node NodeAddr=127.0.0.1 State=UNKNOWN
# each CPU taken by up to 4 jobs at once (no gang scheduling: the kernel shares the cores out):
# the small tasks of the tests, mostly start-up, run together instead of waiting in the queue
# for a CPU of a 2-core machine, and one test's requeued task does not wait for another's array
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
}

node_ready() {   # the node answers and takes jobs (idle, or busy with earlier ones)
  sinfo -h -N -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'
}
munge_up() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }
running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ours() { [ -f "$CONF" ] && [ "$(head -1 "$CONF")" = "$MARK" ]; }
current() { [ -f "$CONF" ] && { ! ours || [ "$(cat "$CONF")" = "$(conf_text)" ]; }; }

stop() {   # the daemons started here, by their pid files: signalled at once (each takes ~2 s
  # to end), then waited for
  local file pids=""
  for file in "$@"; do
    if running "$file"; then
      pids="$pids $(cat "$file")"
      kill "$(cat "$file")"
    fi
  done
  for pid in $pids; do
    wait_for 30 "daemon $pid stopping" sh -c "! kill -0 $pid"
  done
}

start_munge() {
  # munged checks that its key and folders belong to its own user and are private
  install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
  install -d -o munge -g munge -m 0755 /run/munge
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
      || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0600 /etc/munge/munge.key
  runuser -u munge -- munged
  wait_for 10 munged munge_up
  touch "$STATE/munged.ours"          # --stop stops munged only when it was started here
}

stop_all() {
  ours || exit 0                      # another cluster's daemons are not ours to stop
  if [ -f "$STATE/munged.ours" ]; then
    stop "$STATE/slurmd.pid" "$STATE/slurmctld.pid" /run/munge/munged.pid
    rm -f "$STATE/munged.ours"
  else
    stop "$STATE/slurmd.pid" "$STATE/slurmctld.pid"
  fi
  echo "start-cluster: stopped"
}

if [ "${1:-}" = --stop ]; then
  stop_all
  exit 0
fi
for bin in munged slurmctld slurmd sinfo; do
  command -v "$bin" >/dev/null || die "$bin not found: apt-get install slurm-wlm munge"
done
if current && munge_up && node_ready; then
  exit 0                                              # everything is up: nothing to do
fi
[ "$(id -u)" = 0 ] || die "needs root (it starts munged, slurmctld and slurmd)"
if [ -f "$CONF" ] && ! ours; then
  die "$CONF was not written by this script: start that cluster's own daemons instead"
fi

mkdir -p "$STATE/ctld" "$STATE/d" /etc/slurm
munge_up || start_munge
if ! current; then
  stop "$STATE/slurmd.pid" "$STATE/slurmctld.pid"
  conf_text >"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
fi
running "$STATE/slurmctld.pid" || slurmctld
wait_for 30 slurmctld sh -c 'scontrol ping | grep -q UP'
running "$STATE/slurmd.pid" || slurmd
# a node that a previous slurmctld saw vanish stays down until told otherwise
if sinfo -h -N -o %T | grep -qE '^(down|drain)'; then
  scontrol update nodename="$(hostname -s)" state=resume
fi
wait_for 60 "the node" node_ready
echo "start-cluster: SLURM up on $(hostname -s) ($(sinfo -h -N -o '%c CPUs, %m MB'))"
