#!/usr/bin/env bash
# Starts a private single-node Slurm (Debian slurm-wlm 22.05) with accounting (slurmdbd on MariaDB) and two
# fake GPUs, for the Slurm adapter's integration test. Everything lives under $1 (default /tmp/startline-slurm):
# config, state, logs, sockets. Prints the environment to use (SLURM_CONF=..., SLURMRESTD=http://127.0.0.1:port).
# Idempotent: stops a previous instance under the same directory first. Runs as root (as CI does); munged runs as
# the munge user. munge stays the primary auth; JWT (auth/jwt, HS256 key $base/etc/jwt_hs256.key) is the alternate
# one, for slurmrestd (Debian package slurmrestd), which runs as the unprivileged system user startline-restd
# (slurmrestd refuses root and SlurmUser) with rest_auth/jwt on a free loopback port. Tokens:
# `scontrol token username=root lifespan=3600` prints SLURM_JWT=....
set -euo pipefail
base=${1:-/tmp/startline-slurm}
host=$(hostname -s)
"$(dirname "$0")/slurm-down.sh" "$base" >/dev/null 2>&1 || true
mkdir -p "$base"/{etc,state,spool,log,db,run,gpu}
# JWT key for auth/jwt (slurmctld and slurmdbd sign and check tokens with it; only root reads it).
[ -s "$base/etc/jwt_hs256.key" ] || { dd if=/dev/urandom of="$base/etc/jwt_hs256.key" bs=32 count=1 status=none; }
chmod 600 "$base/etc/jwt_hs256.key"
: > "$base/gpu/nvidia0"; : > "$base/gpu/nvidia1"

# munge
mkdir -p /run/munge /etc/munge /var/lib/munge /var/log/munge
[ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; }
chown -R munge:munge /run/munge /etc/munge /var/lib/munge /var/log/munge
chmod 400 /etc/munge/munge.key
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged

# MariaDB for slurmdbd, on a private socket and port
dbport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if [ ! -d "$base/db/mysql" ]; then
  mariadb-install-db --user=root --datadir="$base/db" --auth-root-authentication-method=normal >/dev/null 2>&1
fi
mariadbd --user=root --datadir="$base/db" --socket="$base/run/mysql.sock" --port="$dbport" --bind-address=127.0.0.1 \
  --pid-file="$base/run/mysql.pid" --log-error="$base/log/mysql.log" --skip-grant-tables=0 >/dev/null 2>&1 &
for _ in $(seq 1 100); do [ -S "$base/run/mysql.sock" ] && break; sleep 0.1; done
mariadb --socket="$base/run/mysql.sock" -uroot -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm'; CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"

dbdport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ctlport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')

cat > "$base/etc/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$base/etc/jwt_hs256.key
DbdHost=localhost
DbdPort=$dbdport
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$dbport
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=slurm
LogFile=$base/log/slurmdbd.log
PidFile=$base/run/slurmdbd.pid
CONF
chmod 600 "$base/etc/slurmdbd.conf"

cat > "$base/etc/slurm.conf" <<CONF
ClusterName=startline
SlurmctldHost=$host
SlurmctldPort=$ctlport
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$base/etc/jwt_hs256.key
StateSaveLocation=$base/state
SlurmdSpoolDir=$base/spool
SlurmctldPidFile=$base/run/slurmctld.pid
SlurmdPidFile=$base/run/slurmd.pid
SlurmctldLogFile=$base/log/slurmctld.log
SlurmdLogFile=$base/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MinJobAge=10
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbdport
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/none
JobRequeue=1
NodeName=$host CPUs=8 RealMemory=4000 Gres=gpu:2 State=UNKNOWN
PartitionName=gpu Nodes=$host Default=YES MaxTime=INFINITE State=UP
PartitionName=urgent Nodes=$host Default=NO MaxTime=INFINITE State=UP PriorityTier=10
CONF
cat > "$base/etc/gres.conf" <<CONF
NodeName=$host Name=gpu File=$base/gpu/nvidia[0-1]
CONF
export SLURM_CONF="$base/etc/slurm.conf"
/usr/sbin/slurmdbd
for _ in $(seq 1 150); do sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.2; done
sacctmgr -n show cluster >/dev/null 2>&1 || { echo "slurmdbd did not come up; see $base/log/slurmdbd.log" >&2; exit 1; }
sacctmgr -i add cluster startline >/dev/null 2>&1 || true
/usr/sbin/slurmctld
/usr/sbin/slurmd
for _ in $(seq 1 150); do
  state=$(sinfo -h -o '%t' 2>/dev/null | head -1)
  [ "$state" = "idle" ] && break
  sleep 0.2
done
[ "$state" = "idle" ] || { echo "slurm node not idle ($state); see $base/log" >&2; exit 1; }

# slurmrestd: JWT only, as an unprivileged user, on a free loopback port. It reads slurm.conf from a copy the
# user can read (the base directory may be private, e.g. a test's temporary directory). SLURM_JWT=daemon makes
# auth/jwt slurmrestd's primary auth, so each request's token is passed through to slurmctld and slurmdbd.
id -u startline-restd >/dev/null 2>&1 ||
  useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin startline-restd
restport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
restetc=$(mktemp -d /tmp/startline-restd.XXXXXX)
echo "$restetc" > "$base/run/slurmrestd.etc"
cp "$base/etc/slurm.conf" "$base/etc/gres.conf" "$restetc/"
chmod 755 "$restetc"; chmod 644 "$restetc"/*
SLURM_CONF="$restetc/slurm.conf" SLURM_JWT=daemon setpriv --reuid=startline-restd --regid=startline-restd \
  --clear-groups -- /usr/sbin/slurmrestd -a rest_auth/jwt "127.0.0.1:$restport" \
  >"$base/log/slurmrestd.log" 2>&1 </dev/null &
echo $! > "$base/run/slurmrestd.pid"
for _ in $(seq 1 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$restport/openapi/v3" 2>/dev/null || true)
  [ -n "$code" ] && [ "$code" != "000" ] && break
  sleep 0.1
done
[ -n "$code" ] && [ "$code" != "000" ] || { echo "slurmrestd did not come up; see $base/log/slurmrestd.log" >&2; exit 1; }
echo "SLURM_CONF=$SLURM_CONF"
echo "SLURMRESTD=http://127.0.0.1:$restport"
