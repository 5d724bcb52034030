#!/usr/bin/env bash
# Runs Startline's benchmarks (release build): `all` by default, or `ingest` / `slo` with options,
# e.g. ./scripts/bench.sh slo --waiting 100000 --restart-jobs 1000000
# `core` (not part of `all`: long) measures the collector core as tracked jobs grow (RSS per million jobs,
# bytes on disk per event vs protobuf, API timings, restart), e.g. ./scripts/bench.sh core --sizes 100000,1000000
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --workspace --bins
exec target/release/startline-bench "${@:-all}"
