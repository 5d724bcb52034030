#!/usr/bin/env bash
# Makes the screenshots of the docs (docs/img/dashboard-*.png) from the demo, so they show what the current code
# draws: a collector with the demo's configuration (deploy/demo.toml) on a fresh store, the demo's simulated fleet
# replayed into it (the flags of scripts/demo.sh, without --follow), then each dashboard view in headless Chromium.
#
# Environment: STARTLINE_BIN (directory of the two binaries; default target/release, built here like demo.sh
# builds them), SIM_ARGS (as in demo.sh), OUT (default docs/img).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${STARTLINE_BIN:-target/release}
if [ -z "${STARTLINE_BIN:-}" ]; then
  cargo build --release --locked -p startline-collector -p startline-agent
fi
out=${OUT:-docs/img}
mkdir -p "$out"
command -v chromium >/dev/null || { echo "chromium is needed (apt-get install chromium fonts-dejavu-core)" >&2; exit 1; }

work=$(mktemp -d)
log="$work/collector.log"
"$bin/startline-collector" --config deploy/demo.toml --data-dir "$work/data" --grpc-listen 127.0.0.1:0 \
  --http-listen 127.0.0.1:0 >"$log" 2>"$work/collector.err" &
collector=$!
trap 'kill -TERM $collector 2>/dev/null; wait $collector 2>/dev/null; rm -rf "$work"' EXIT INT TERM
for _ in $(seq 1 300); do
  grep -q '^startline-collector ready' "$log" && break
  kill -0 $collector 2>/dev/null || { cat "$work/collector.err" >&2; echo "collector failed to start" >&2; exit 1; }
  sleep 0.1
done
line=$(grep '^startline-collector ready' "$log")
grpc=${line##*grpc=}; grpc=${grpc%% *}
http=${line##*http=}

# The demo's fleet: a week of history, the scripted H100 crunch (so the urgent SLO pages), chains.
# shellcheck disable=SC2086
"$bin/startline-agent" --collector "http://$grpc" simulate ${SIM_ARGS:---history 7d --disorder 0.02 --duplicates 0.01 --chains 0.03 --crunch}

# A job for the timeline view: the first urgent job that waited in more than one segment.
job=$(curl -sf "http://$http/api/v1/jobs?priority=urgent&state=done&limit=200" |
  python3 -c 'import json,sys; jobs=json.load(sys.stdin)["jobs"]; print(jobs[len(jobs)//2]["job_id"])')

shoot() { # VIEW FILE
  chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
    --window-size=1400,1000 --virtual-time-budget=10000 --user-data-dir="$work/profile-$2" \
    --screenshot="$out/$2" "http://$http/#$1" >/dev/null 2>&1
  [ -s "$out/$2" ] || { echo "no screenshot of #$1" >&2; exit 1; }
  echo "$out/$2  (#$1)"
}
shoot queue dashboard-queue.png
shoot slos dashboard-slos.png
shoot compare dashboard-compare.png
shoot goodput dashboard-goodput.png
shoot chains dashboard-chains.png
shoot nodes dashboard-nodes.png
shoot "job/$job" dashboard-job.png
