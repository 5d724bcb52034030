#!/usr/bin/env bash
# Runs Startline's benchmarks (release build). Extra arguments go to `startline-bench ingest`,
# e.g. ./scripts/bench.sh --events 200000 --restart-jobs 100000
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --workspace --bins
exec target/release/startline-bench ingest "$@"
