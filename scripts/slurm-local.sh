#!/usr/bin/env bash
# A real single-node Slurm (slurmctld + slurmd + a private munged) on localhost, for the
# launcher's end-to-end tests. Follows ../shared/reference/slurm-local.md (Debian 12, Slurm 22.05).
#
# usage: scripts/slurm-local.sh start|stop|status|env
#   start   install the Debian packages if missing (root + apt), write the config, start the
#           daemons and wait until the node is idle. Idempotent: a running cluster is kept.
#   stop    cancel every job, stop slurmd, slurmctld and munged (by their recorded pids).
#   status  print sinfo/squeue, exit 1 when the cluster is not up.
#   env     print the line to eval so that client commands find the cluster:
#           eval "$(scripts/slurm-local.sh env)"
# Everything (key, sockets, state, spool, logs, pids) lives in $SCDINO_SLURM_DIR
# (default /var/tmp/scdino-slurm); client commands need SLURM_CONF=$SCDINO_SLURM_DIR/slurm.conf.
# Ports: $SCDINO_SLURM_PORT (slurmctld, default 6817) and +1 (slurmd).
set -euo pipefail
S=$(realpath -m "${SCDINO_SLURM_DIR:-/var/tmp/scdino-slurm}")
CTLD_PORT=${SCDINO_SLURM_PORT:-6817}
D_PORT=$((CTLD_PORT + 1))
export SLURM_CONF=$S/slurm.conf
log() { printf '[slurm-local] %s\n' "$*" >&2; }

alive() {
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $s != Z* ]]
}
pid_of() { cat "$1" 2>/dev/null || true; }
node_state() { sinfo -h -n localhost -o %T 2>/dev/null || true; }

install_packages() {
  local missing=() bin pkg
  for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
    bin=${pair%%:*} pkg=${pair#*:}
    command -v "$bin" >/dev/null 2>&1 || [[ -x /usr/sbin/$bin ]] || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -ne 0 ]]; then
    log "missing packages: ${missing[*]}; run as root or: apt-get install --no-install-recommends ${missing[*]}"
    exit 1
  fi
  log "installing ${missing[*]} (apt-get, about 15 s)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

write_config() {
  mkdir -p "$S"/munge "$S"/ctld "$S"/spool "$S"/log
  chmod 755 "$S"/munge # munged needs o+x on its socket directory
  if [[ ! -f $S/munge/munge.key ]]; then
    log "creating munge key $S/munge/munge.key"
    mungekey -c -k "$S"/munge/munge.key
  fi
  # CPUs as the machine has them; RealMemory well below the real memory (memory is not scheduled).
# The node is named localhost because job scripts use the first node *name* as the rendezvous
# host (as on real clusters, where node names resolve), and localhost always resolves.
  cat >"$S"/slurm.conf <<EOF
# Written by scripts/slurm-local.sh: a throw-away single-node cluster on localhost.
ClusterName=local
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$D_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/ctld
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$S/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
SchedulerParameters=batch_sched_delay=0,sched_interval=2
DependencyParameters=kill_invalid_depend
NodeName=localhost NodeAddr=127.0.0.1 NodeHostname=localhost CPUs=$(nproc) RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  install_packages
  if [[ -f $S/slurm.conf ]] && alive "$(pid_of "$S"/slurmctld.pid)" && [[ $(node_state) == idle || $(node_state) == mixed || $(node_state) == allocated ]]; then
    log "already running (SLURM_CONF=$SLURM_CONF)"
    return 0
  fi
  stop_daemons quiet
  write_config
  log "starting munged, slurmctld, slurmd in $S"
  munged --key-file="$S"/munge/munge.key --socket="$S"/munge/munge.socket \
    --pid-file="$S"/munge/munged.pid --log-file="$S"/munge/munged.log \
    --seed-file="$S"/munge/munged.seed
  slurmctld -c      # daemonizes; -c discards saved job/node state
  slurmd -N localhost # daemonizes
  local i
  for i in $(seq 1 300); do
    [[ $(node_state) == idle ]] && break
    sleep 0.1
  done
  if [[ $(node_state) != idle ]]; then
    log "node did not become idle; logs in $S/log"
    tail -n 20 "$S"/log/slurmctld.log "$S"/log/slurmd.log >&2 || true
    exit 1
  fi
  log "up: node localhost idle with $(nproc) CPUs; export SLURM_CONF=$SLURM_CONF"
}

stop_pid() { # TERM, wait up to 15 s (a zombie counts as exited), then KILL
  local pid=$1 i
  [[ -n $pid ]] && alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 150); do
    alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

stop_daemons() {
  local pid_d pid_c pid_m i
  # Read the pids first: the daemons delete their pid files while shutting down.
  pid_d=$(pid_of "$S"/slurmd.pid)
  pid_c=$(pid_of "$S"/slurmctld.pid)
  pid_m=$(pid_of "$S"/munge/munged.pid)
  [[ ${1:-} == quiet ]] || log "stopping (slurmd ${pid_d:--}, slurmctld ${pid_c:--}, munged ${pid_m:--})"
  if [[ -n $pid_c ]] && alive "$pid_c"; then
    # Cancel jobs first: slurmstepd processes survive a slurmd shutdown.
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null || true)
    if [[ -n $jobs ]]; then
      log "cancelling jobs: $(echo $jobs)"
      # shellcheck disable=SC2086
      scancel --full --signal=KILL $jobs 2>/dev/null || true
      for i in $(seq 1 100); do
        [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
        sleep 0.1
      done
    fi
  fi
  stop_pid "$pid_d"
  stop_pid "$pid_c"
  stop_pid "$pid_m"
}

case ${1:-} in
start) start ;;
stop)
  stop_daemons
  log "stopped"
  ;;
status)
  if [[ -f $S/slurm.conf ]] && alive "$(pid_of "$S"/slurmctld.pid)"; then
    sinfo
    squeue
  else
    log "not running"
    exit 1
  fi
  ;;
env) printf 'export SLURM_CONF=%q\n' "$S/slurm.conf" ;;
*)
  echo "usage: $0 start|stop|status|env" >&2
  exit 2
  ;;
esac
