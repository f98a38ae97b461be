#!/usr/bin/env bash
# A throwaway SLURM cluster on this machine (loopback only), for tests that
# start ranks with a real srun: one node, or several nodes that are all this
# machine (one slurmd each).
#
#   tests/slurm_cluster.sh COMMAND ARGS...
#
# starts munged (a fresh key), slurmctld and a slurmd per node, all in a new
# temp dir with ports of their own, waits until every node is idle, runs COMMAND with
# SLURM_CONF pointing at the cluster (so srun, sbatch, sinfo, scontrol talk to
# it), then tears everything down (its jobs, the daemons, the temp dir)
# however COMMAND ended, and exits with COMMAND's status.
#
# Exits 77 (and prints "skipped: ...", why) when the SLURM or munge binaries
# are missing or the cluster does not come up; the daemons' logs are then
# shown. It never touches the system's SLURM or munge (/etc/slurm,
# /run/munge): nothing here needs them configured.
#
# DOPT_SLURM_NODES nodes (default 1): the first is named after the host
# (hostname -s), so that the node list of a job resolves, the others
# HOST-2, HOST-3, ... Each claims DOPT_SLURM_CPUS CPUs (default 8, or nproc
# when larger), whatever the machine has (SlurmdParameters=config_overrides),
# so that 3 or 4 tasks fit on a 2-core machine without --overcommit. Root only: slurmd
# launches tasks as their user, which needs root (SlurmUser and SlurmdUser are
# root; other users are not tried, the script skips).
#
# Sourcing the file instead defines slurm_cluster_start DIR (DIR need not
# exist; it unsets every other SLURM_* variable, so that the job of an outer
# SLURM does not leak in, and exports SLURM_CONF; it returns non-zero with the
# reason in $slurm_cluster_why), slurm_cluster_logs (the daemons' last log
# lines) and slurm_cluster_stop, which the caller runs on exit (it removes
# DIR). Should the caller die without it (SIGKILL, a test's timeout), a
# watchdog started with the cluster does the same once the caller is gone.
#
#   tests/slurm_cluster.sh --stop DIR     tears down the cluster in DIR

_sc_self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
slurm_cluster_why=
_sc_dir=

_sc_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The processes of the cluster in DIR: the daemons (started with
# DOPT_SLURM_CLUSTER=DIR in their environment) and every slurmstepd (it
# rewrites its environment for its process title, but keeps slurmd's log in
# DIR open). Never this shell.
_sc_pids() {
  {
    grep -lzxF "DOPT_SLURM_CLUSTER=$1" /proc/[0-9]*/environ 2>/dev/null
    find /proc/[0-9]*/fd -maxdepth 1 -lname "$1/*" 2>/dev/null
  } | sed -n 's|^/proc/\([0-9]*\)/.*|\1|p' | sort -u | grep -vx "$$"
}

# Tears down the cluster in DIR: cancels its jobs and waits (10 s at most)
# until they are gone, so that slurmstepd ends their tasks; then SIGTERM to
# its processes, SIGKILL to those left after 5 s; removes DIR.
_sc_teardown() {
  local dir=$1 pids i
  [ -n "$dir" ] && [ -d "$dir" ] || return 0
  if [ -S "$dir/munge.sock" ] && [ -f "$dir/slurm.conf" ]; then
    export SLURM_CONF=$dir/slurm.conf
    if timeout 10 scancel --full --quiet --partition debug >/dev/null 2>&1; then
      for ((i = 0; i < 50; i++)); do
        [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
  fi
  pids=$(_sc_pids "$dir")
  [ -n "$pids" ] && kill $pids 2>/dev/null
  for ((i = 0; i < 50; i++)); do
    pids=$(_sc_pids "$dir")
    [ -z "$pids" ] && break
    sleep 0.1
  done
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  rm -rf "$dir"
}

slurm_cluster_logs() {
  local f
  for f in "$_sc_dir"/munged.log "$_sc_dir"/slurmctld.out "$_sc_dir"/slurmctld.log "$_sc_dir"/slurmd*.out \
    "$_sc_dir"/slurmd*.log; do
    [ -s "$f" ] || continue
    echo "--- ${f##*/} (last lines)"
    tail -n 15 "$f"
  done
}

slurm_cluster_start() {
  _sc_dir=${1:?slurm_cluster_start DIR}
  local b
  for b in munged slurmctld slurmd srun sbatch squeue sinfo scontrol scancel; do
    command -v "$b" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin command -v "$b" >/dev/null 2>&1 || {
      slurm_cluster_why="$b is not installed (Debian: apt-get install slurmctld slurmd slurm-client munge)"
      return 1
    }
  done
  PATH=$PATH:/usr/sbin
  [ "$(id -u)" = 0 ] || {
    slurm_cluster_why="slurmd must run as root, this is uid $(id -u)"
    return 1
  }
  mkdir -p "$_sc_dir/state" && chmod 700 "$_sc_dir" || {
    slurm_cluster_why="cannot make $_sc_dir"
    return 1
  }
  _sc_dir=$(cd "$_sc_dir" && pwd)
  local host cpus ctld_port user n i
  local -a nodes=()
  host=$(hostname -s)
  n=${DOPT_SLURM_NODES:-1}
  cpus=${DOPT_SLURM_CPUS:-$(($(nproc) > 8 ? $(nproc) : 8))}
  ctld_port=$(_sc_free_port)
  user=$(id -un)
  nodes=("$host")
  for ((i = 2; i <= n; i++)); do nodes+=("$host-$i"); done
  cat >"$_sc_dir/slurm.conf" <<EOF
ClusterName=dopt-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=$user
SlurmdUser=$user
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$_sc_dir/munge.sock
StateSaveLocation=$_sc_dir/state
SlurmdSpoolDir=$_sc_dir/spool-%n
SlurmctldPidFile=$_sc_dir/slurmctld.pid
SlurmdPidFile=$_sc_dir/slurmd-%n.pid
SlurmctldLogFile=$_sc_dir/slurmctld.log
SlurmdLogFile=$_sc_dir/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
PropagateResourceLimits=NONE
ReturnToService=2
MinJobAge=5
KillWait=5
InactiveLimit=0
EOF
  # every node is this machine: same address, a port each
  for i in "${nodes[@]}"; do
    echo "NodeName=$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$(_sc_free_port) CPUs=$cpus State=UNKNOWN"
    mkdir -p "$_sc_dir/spool-$i"
  done >>"$_sc_dir/slurm.conf"
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES" >>"$_sc_dir/slurm.conf"
  # The daemons leave the caller's process tree, so a kill of that tree
  # misses them: the watchdog (outside the tree too) tears the cluster down
  # once the caller is gone, however it ended.
  setsid -f bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done; exec bash "$2" --stop "$3"' \
    slurm-cluster-watchdog "$$" "$_sc_self" "$_sc_dir" </dev/null >/dev/null 2>&1
  # munged: a fresh key, its socket in the cluster dir (-f: /tmp above the
  # dir is world-writable, which munged otherwise refuses)
  head -c 1024 /dev/urandom >"$_sc_dir/munge.key" && chmod 400 "$_sc_dir/munge.key"
  DOPT_SLURM_CLUSTER=$_sc_dir munged -f --socket="$_sc_dir/munge.sock" --key-file="$_sc_dir/munge.key" \
    --pid-file="$_sc_dir/munged.pid" --log-file="$_sc_dir/munged.log" --seed-file="$_sc_dir/munged.seed" \
    >>"$_sc_dir/munged.log" 2>&1 || {
    slurm_cluster_why="munged did not start"
    return 1
  }
  local v
  for v in $(compgen -v SLURM_); do unset "$v"; done
  export SLURM_CONF=$_sc_dir/slurm.conf
  # -c: no saved state; -i: ignore what cannot be recovered
  DOPT_SLURM_CLUSTER=$_sc_dir slurmctld -c -i -f "$SLURM_CONF" >>"$_sc_dir/slurmctld.out" 2>&1 || {
    slurm_cluster_why="slurmctld did not start"
    return 1
  }
  for i in "${nodes[@]}"; do
    DOPT_SLURM_CLUSTER=$_sc_dir slurmd -N "$i" -f "$SLURM_CONF" >>"$_sc_dir/slurmd-$i.out" 2>&1 || {
      slurm_cluster_why="slurmd of node $i did not start"
      return 1
    }
  done
  # up when sinfo lists every node idle (30 s: a slurmd registers at once)
  local state=
  for ((i = 0; i < 60; i++)); do
    state=$(sinfo -h -N -o "%N:%T" 2>/dev/null | sort | tr '\n' ' ')
    [ "$(grep -o ":idle" <<<"$state" | wc -l)" = "$n" ] && return 0
    sleep 0.5
  done
  slurm_cluster_why="not every node is idle after 30 s (sinfo says '${state:-nothing}')"
  return 1
}

slurm_cluster_stop() {
  _sc_teardown "$_sc_dir"
  _sc_dir=
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  if [ "${1:-}" = --stop ]; then
    PATH=$PATH:/usr/sbin
    _sc_teardown "${2:?--stop DIR}"
    exit 0
  fi
  [ $# -gt 0 ] || {
    echo "usage: $0 COMMAND ARGS...   or   $0 --stop DIR" >&2
    exit 2
  }
  dir=$(mktemp -d /tmp/dopt-slurm.XXXXXX)
  trap slurm_cluster_stop EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  if ! slurm_cluster_start "$dir"; then
    echo "skipped: no SLURM cluster: $slurm_cluster_why"
    slurm_cluster_logs
    exit 77
  fi
  "$@"
  exit
fi
