#!/usr/bin/env bash
# Stops the private Slurm started by slurm-up.sh under $1 (default /tmp/startline-slurm).
base=${1:-/tmp/startline-slurm}
for p in slurmrestd slurmd slurmctld slurmdbd mysql; do
  [ -f "$base/run/$p.pid" ] && kill "$(cat "$base/run/$p.pid")" 2>/dev/null
done
sleep 0.5
for p in slurmrestd slurmd slurmctld slurmdbd mysql; do
  [ -f "$base/run/$p.pid" ] && kill -9 "$(cat "$base/run/$p.pid")" 2>/dev/null
  rm -f "$base/run/$p.pid"
done
[ -f "$base/run/slurmrestd.etc" ] && rm -rf "$(cat "$base/run/slurmrestd.etc")" && rm -f "$base/run/slurmrestd.etc"
exit 0
