#!/usr/bin/env bash
# The main job on the embedded default: a collector on sled (./startline-data) and a simulated fleet of managed
# and dedicated pools feeding it over gRPC: a week of history replayed in seconds, then live in real time.
# Prints where to look. Ctrl-C stops both.
#
# Environment: STARTLINE_DATA (sled dir), STARTLINE_GRPC / STARTLINE_HTTP (listen addresses),
# SIM_ARGS (the `startline-agent simulate` flags; default "--history 7d --disorder 0.02 --duplicates 0.01 --chains 0.03 --crunch").
set -euo pipefail
cd "$(dirname "$0")/.."

data=${STARTLINE_DATA:-./startline-data}
grpc=${STARTLINE_GRPC:-127.0.0.1:50051}
http=${STARTLINE_HTTP:-127.0.0.1:8080}

# The same command scripts/test.sh runs for its release build, so after the tests this is a no-op (building every
# workspace binary instead would rebuild with other features for many minutes).
cargo build --release --locked -p startline-collector -p startline-agent
bin=target/release

out=$(mktemp)
"$bin/startline-collector" --config deploy/demo.toml --data-dir "$data" --grpc-listen "$grpc" --http-listen "$http" >"$out" &
collector=$!
trap 'kill -TERM $collector 2>/dev/null; wait $collector 2>/dev/null; rm -f "$out"' EXIT INT TERM
for _ in $(seq 1 100); do
  grep -q '^startline-collector ready' "$out" && break
  kill -0 $collector 2>/dev/null || { echo "collector failed to start" >&2; exit 1; }
  sleep 0.1
done
line=$(grep '^startline-collector ready' "$out")
grpc_bound=${line##*grpc=}; grpc_bound=${grpc_bound%% *}
http_bound=${line##*http=}

cat <<MSG

Startline is running.
  Dashboard:       http://$http_bound/
  Jobs API:        http://$http_bound/api/v1/jobs
  One job:         http://$http_bound/api/v1/jobs/<job_id>    (e.g. slurm/a100/0000005)
  Waiting now:     http://$http_bound/api/v1/jobs?state=queued
  Health:          http://$http_bound/healthz  http://$http_bound/readyz
  gRPC ingest:     $grpc_bound (startline.v1.IngestService, health, reflection)
  SLOs / alerts:   http://$http_bound/api/v1/slos  http://$http_bound/api/v1/alerts
  Compare:         http://$http_bound/api/v1/compare   (CLI: target/release/startline-collector compare --api http://$http_bound)
  GPU time, cost:  http://$http_bound/#goodput   (API: /api/v1/goodput?by=team, /api/v1/cost; prices in deploy/demo.toml)
  API contract:    http://$http_bound/api/v1/openapi.json
  Metrics:         http://$http_bound/metrics

Simulating a fleet (history first, then live). Ctrl-C to stop.
MSG
# shellcheck disable=SC2086
"$bin/startline-agent" --collector "http://$grpc_bound" simulate --follow ${SIM_ARGS:---history 7d --disorder 0.02 --duplicates 0.01 --chains 0.03 --crunch}
