#!/usr/bin/env bash
# Runs every Startline test on a fresh machine: installs what the tests need (Debian's Alertmanager, Prometheus, Chromium, Slurm and tzdata,
# Python grpcio for the foreign-client test, cargo-nextest, cargo-deny and mdbook if missing), checks formatting and lints, builds the binaries the end-to-end tests start,
# and runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '==> %s\n' "$*"; }

# Debian packages the integration tests start for real: Alertmanager (alerting tests; htpasswd from apache2-utils
# makes the bcrypt hash of its basic-auth user), Prometheus (promtool),
# Chromium (built-in dashboard test), Slurm with munge, slurmdbd, MariaDB, slurmrestd and the auth/jwt plugin
# (Slurm adapter tests, command and REST mode; started by scripts/slurm-up.sh), tzdata (SLO time zones); for the deployment artefacts: systemd (systemd-analyze verify),
# lintian and dpkg-dev (the .deb packages), kubectl (kustomize rendering; this machine's kubectl carries kustomize
# v5, Debian's kubernetes-client is the fallback but its kustomize is too old for the overlays, and the test says so).
need=()
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v htpasswd >/dev/null 2>&1 || need+=(apache2-utils)
[ -e /usr/share/zoneinfo/Europe/Moscow ] || need+=(tzdata)
command -v chromium >/dev/null 2>&1 || need+=(chromium fonts-dejavu-core)
command -v slurmctld >/dev/null 2>&1 || need+=(slurm-wlm munge)
command -v slurmdbd >/dev/null 2>&1 || need+=(slurmdbd)
command -v slurmrestd >/dev/null 2>&1 || need+=(slurmrestd)
[ -e /usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so ] || need+=(slurm-wlm-jwt-plugin)
command -v mariadbd >/dev/null 2>&1 || need+=(mariadb-server)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
command -v lintian >/dev/null 2>&1 || need+=(lintian)
command -v dpkg-shlibdeps >/dev/null 2>&1 || need+=(dpkg-dev)
command -v file >/dev/null 2>&1 || need+=(file)
command -v kubectl >/dev/null 2>&1 || need+=(kubernetes-client)
# buildah: the container image is built without a registry (scripts/build-image.sh, tests/tests/container.rs and
# release.rs); faketime: an adapter whose clock lags, for the stale-adapter alert against a real Prometheus
# (tests/tests/kube_prometheus.rs). Both from Debian, about 20 s to install together.
command -v buildah >/dev/null 2>&1 || need+=(buildah)
command -v faketime >/dev/null 2>&1 || need+=(faketime)
if [ ${#need[@]} -gt 0 ]; then
  log "installing Debian packages: ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! python3 -c 'import grpc_tools, grpc_health' 2>/dev/null; then
  log "installing Python grpcio, grpcio-tools, grpcio-health-checking (foreign client test)"
  python3 -m pip install --quiet --disable-pip-version-check grpcio grpcio-tools grpcio-health-checking
fi
if ! python3 -c 'import openapi_spec_validator' 2>/dev/null; then
  log "installing Python openapi-spec-validator (the API's OpenAPI document)"
  python3 -m pip install --quiet --disable-pip-version-check openapi-spec-validator
fi
if ! python3 -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null; then
  log "installing Python kubernetes-validate, jsonschema, PyYAML (offline Kubernetes and CRD schema validation)"
  python3 -m pip install --quiet --disable-pip-version-check kubernetes-validate jsonschema pyyaml
fi
if ! python3 -c 'import build' 2>/dev/null; then
  log "installing Python build (the startline package's wheel and sdist)"
  python3 -m pip install --quiet --disable-pip-version-check build
fi
# DuckDB: the history files' DuckDB check (tests/history/reproduce.py recomputes the API's answers from the Parquet files).
if ! python3 -c 'import duckdb' 2>/dev/null; then
  log "installing Python duckdb (the history files' DuckDB check)"
  python3 -m pip install --quiet --disable-pip-version-check duckdb
fi
# moto's S3 server (moto[server] brings Flask, flask-cors and boto3): tests/tests/history_export.rs uploads to it.
if ! python3 -c 'import moto, flask, flask_cors' 2>/dev/null; then
  log "installing Python moto[server] (the history export test against moto's S3 server)"
  python3 -m pip install --quiet --disable-pip-version-check 'moto[server]'
fi
# Real PyTorch Lightning and Hugging Face Transformers for the package's callback tests (tests/tests/python_client.rs),
# in a venv under target/ kept between runs: PyPI's Linux torch wheel brings its CUDA libraries (measured: about
# 3 min and 5.3 GB for torch, 45 s more and 5.6 GB with lightning and transformers; BENCHMARKS.md).
frameworks=target/python-frameworks
if ! "$frameworks/bin/python" -c 'import torch, lightning, transformers, accelerate' 2>/dev/null; then
  log "installing torch, lightning, transformers into $frameworks (once; reused by later runs)"
  python3 -m venv "$frameworks"
  "$frameworks/bin/python" -m pip install --quiet --disable-pip-version-check torch lightning transformers accelerate
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

if ! cargo deny --version >/dev/null 2>&1; then
  log "installing cargo-deny (supply-chain check)"
  cargo install --locked cargo-deny
fi

# mdBook builds the documentation book in docs/ (tests/tests/docs.rs). Without its default features (the
# `serve`/`watch` web server and the search index) it builds in ~2.5 CPU-minutes instead of ~3.5.
if ! command -v mdbook >/dev/null 2>&1 && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/mdbook" ]; then
  log "installing mdbook (the documentation book)"
  cargo install --locked mdbook --no-default-features
fi

log "cargo fmt --check"
cargo fmt --all -- --check
log "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
log "building binaries for the end-to-end tests"
cargo build --workspace --bins --locked
# The release build the container image and the .deb packages are made from (tests/tests/container.rs and
# packaging.rs run this same command; built here, it is a no-op there and does not compete with other tests).
log "release build for the packaging tests"
cargo build --release --locked -p startline-collector -p startline-agent
log "running tests"
cargo nextest run --workspace --locked --no-fail-fast
