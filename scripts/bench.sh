#!/usr/bin/env bash
# Runs Startline's benchmarks (release build): `all` by default, or `ingest` / `slo` with options,
# e.g. ./scripts/bench.sh slo --waiting 100000 --restart-jobs 1000000
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --workspace --bins
exec target/release/startline-bench "${@:-all}"
