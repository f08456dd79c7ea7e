#!/usr/bin/env bash
# Services that the sweep tests need, on this machine only (loopback, root):
#   * a single-node SLURM cluster: munged + slurmctld + slurmd (Debian's slurm-wlm, munge)
#   * PostgreSQL (Debian's postgresql) with a database for Optuna's RDB storage
#
#   .ci/services.sh start   # apt-get installs what is missing, starts both, writes .ci/services.env
#   source .ci/services.env # exports SLURM_CONF and COFR_TEST_POSTGRES_URL for the tests
#   .ci/services.sh stop    # stops what start started (by the PIDs in its pid files)
#
# State, configs and logs live in $COFR_SERVICES_DIR (default /tmp/cofr-services).
# Without this script the SLURM and PostgreSQL tests skip, saying why.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${COFR_SERVICES_DIR:-/tmp/cofr-services}
ENV_FILE=${COFR_SERVICES_ENV:-$HERE/services.env}
PG_PORT=${COFR_PG_PORT:-55432}
SLURM_DIR=$STATE/slurm
PG_DIR=$STATE/postgres
CONF=$SLURM_DIR/slurm.conf

log() { echo "[services] $*"; }
die() { echo "[services] error: $*" >&2; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts daemons)"; }

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1; }

install_packages() {
    local missing=()
    command -v slurmctld >/dev/null || missing+=(slurm-wlm)
    command -v munged >/dev/null || missing+=(munge)
    [ -n "$(pg_bin)" ] || missing+=(postgresql)
    if [ ${#missing[@]} -eq 0 ]; then
        return
    fi
    log "installing ${missing[*]} (apt-get)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$STATE/apt.log" 2>&1 \
        || { tail -n 20 "$STATE/apt.log" >&2; die "apt-get install failed"; }
}

pid_of() { [ -s "$1" ] && cat "$1" || true; }

alive() { local pid; pid=$(pid_of "$1"); [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; }

start_munge() {
    mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
    if [ ! -s /etc/munge/munge.key ]; then
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile=/etc/munge/munge.key
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
    fi
    chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
    chmod 0700 /etc/munge /var/lib/munge /var/log/munge
    chmod 0755 /run/munge
    chmod 0400 /etc/munge/munge.key
    if alive /run/munge/munged.pid; then
        log "munged already running (pid $(pid_of /run/munge/munged.pid))"
        return
    fi
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do alive /run/munge/munged.pid && break; sleep 0.1; done
    alive /run/munge/munged.pid || die "munged did not start"
    cp /run/munge/munged.pid "$STATE/munged.pid"
    log "munged started (pid $(pid_of "$STATE/munged.pid"))"
}

write_slurm_conf() {
    local cpus mem
    cpus=$(nproc)
    mem=$(awk '/MemTotal/ {printf "%d", $2 / 1024 * 0.8}' /proc/meminfo)
    rm -rf "$SLURM_DIR"
    mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool"
    cat >"$CONF" <<CONF
# Written by .ci/services.sh: a single-node cluster for tests.
ClusterName=cofr
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CryptoType=crypto/munge
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/slurmctld.log
SlurmdLogFile=$SLURM_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
KillWait=10
NodeName=localhost CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
}

start_slurm() {
    if alive "$SLURM_DIR/slurmctld.pid"; then
        log "slurmctld already running"
        return
    fi
    write_slurm_conf
    export SLURM_CONF=$CONF
    slurmctld -f "$CONF"
    slurmd -f "$CONF" -N localhost
    for _ in $(seq 100); do
        if scontrol ping 2>/dev/null | grep -q UP \
            && sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
            log "SLURM up: $(sinfo -h -o '%P %D %t %c CPUs')"
            return
        fi
        sleep 0.2
    done
    tail -n 20 "$SLURM_DIR/slurmctld.log" "$SLURM_DIR/slurmd.log" >&2 || true
    die "SLURM did not come up"
}

start_postgres() {
    local bin
    bin=$(pg_bin)
    [ -n "$bin" ] || die "PostgreSQL is not installed"
    if [ -f "$PG_DIR/data/postmaster.pid" ] && runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" status >/dev/null 2>&1; then
        log "PostgreSQL already running"
        return
    fi
    rm -rf "$PG_DIR"
    mkdir -p "$PG_DIR/socket"
    chown -R postgres:postgres "$PG_DIR"
    chmod 0755 "$STATE"
    runuser -u postgres -- "$bin/initdb" -D "$PG_DIR/data" -U postgres -A trust >"$PG_DIR/initdb.log" 2>&1 \
        || { cat "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
    runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/postgres.log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR/socket" start >/dev/null \
        || { tail -n 20 "$PG_DIR/postgres.log" >&2; die "PostgreSQL did not start"; }
    local psql=("$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -v ON_ERROR_STOP=1 -q)
    runuser -u postgres -- "${psql[@]}" -c "CREATE ROLE cofr LOGIN PASSWORD 'cofr'"
    runuser -u postgres -- "${psql[@]}" -c "CREATE DATABASE cofr_test OWNER cofr"
    log "PostgreSQL up on 127.0.0.1:$PG_PORT (database cofr_test)"
}

write_env() {
    cat >"$ENV_FILE" <<ENV
# Written by .ci/services.sh start; source it before the tests.
export SLURM_CONF=$CONF
export COFR_TEST_POSTGRES_URL=postgresql://cofr:cofr@127.0.0.1:$PG_PORT/cofr_test
ENV
    log "wrote $ENV_FILE"
}

stop_pidfile() {
    local name=$1 file=$2 pid
    pid=$(pid_of "$file")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        log "stopped $name (pid $pid)"
    fi
}

case "${1:-}" in
start)
    need_root
    mkdir -p "$STATE"
    install_packages
    start_munge
    start_slurm
    start_postgres
    write_env
    ;;
stop)
    stop_pidfile slurmd "$SLURM_DIR/slurmd.pid"
    stop_pidfile slurmctld "$SLURM_DIR/slurmctld.pid"
    stop_pidfile munged "$STATE/munged.pid"
    if [ -d "$PG_DIR/data" ] && [ -n "$(pg_bin)" ]; then
        runuser -u postgres -- "$(pg_bin)/pg_ctl" -D "$PG_DIR/data" -m fast stop >/dev/null 2>&1 \
            && log "stopped PostgreSQL" || true
    fi
    rm -f "$ENV_FILE"
    ;;
*)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
