#!/usr/bin/env bash
# Builds every release artefact of Startline with one command, into one directory:
#
#   startline-collector-VERSION-ARCH-linux.tar.gz   the binary, LICENSE, README.md, CHANGELOG.md, example
#   startline-agent-VERSION-ARCH-linux.tar.gz       configs, systemd units, shell completions (bash, zsh, fish)
#                                                   and man pages
#   startline-collector_VERSION_ARCH.deb            scripts/package-deb.sh
#   startline-agent_VERSION_ARCH.deb
#   startline-VERSION-oci.tar                       the container image (scripts/build-image.sh; buildah)
#   startline-VERSION.cdx.json                      CycloneDX 1.6 SBOM of both binaries (scripts/sbom.py)
#   SHA256SUMS                                      `sha256sum -c SHA256SUMS` verifies all of the above
#
#   scripts/release.sh [--out DIR] [--no-build]
#
# --out DIR     where the artefacts go (default: <target dir>/release-bundle/startline-VERSION); emptied first
# --no-build    use the release binaries already in the target dir
#
# Tarballs are reproducible for a commit (sorted, owner root, mtime SOURCE_DATE_EPOCH, else the commit's time).
# Checked by tests/tests/release.rs (checksums, contents, completions loaded by bash, the SBOM against the
# CycloneDX schema and the crates in the binaries).
set -euo pipefail
cd "$(dirname "$0")/.."

out=""
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "release.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# The same command as the builder stage of deploy/Containerfile and scripts/package-deb.sh.
BUILD_CMD="cargo build --release --locked -p startline-collector -p startline-agent"
if [ "$build" = 1 ]; then
  $BUILD_CMD
fi
meta=$(cargo metadata --format-version 1 --no-deps --locked)
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")
version=$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="startline-collector"))' <<<"$meta")
arch=$(uname -m)
out=${out:-$target_dir/release-bundle/startline-$version}
rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
release="$target_dir/release"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

# One tarball per binary. $1: binary; $2...: "SRC:DEST" extra files (DEST relative to the tarball's top folder).
tarball() {
  local bin="$1"; shift
  local top="$bin-$version-$arch-linux"
  local d="$stage/$top"
  mkdir -p "$d/completions" "$d/man/man1" "$d/systemd" "$d/examples"
  strip --strip-debug -o "$d/$bin" "$release/$bin"
  cp LICENSE README.md CHANGELOG.md "$d/"
  for spec in "$@"; do
    mkdir -p "$(dirname "$d/${spec#*:}")"
    cp "${spec%%:*}" "$d/${spec#*:}"
  done
  "$release/$bin" completions bash > "$d/completions/$bin.bash"
  "$release/$bin" completions zsh > "$d/completions/_$bin"
  "$release/$bin" completions fish > "$d/completions/$bin.fish"
  "$release/$bin" man --out "$d/man/man1"
  tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
    -C "$stage" -cf - "$top" | gzip -n > "$out/$top.tar.gz"
}

tarball startline-collector \
  deploy/systemd/startline-collector.service:systemd/startline-collector.service \
  deploy/collector.example.toml:examples/collector.toml \
  deploy/container/collector.toml:examples/collector-container.toml \
  deploy/prometheus/startline-rules.yml:examples/prometheus/startline-rules.yml \
  deploy/prometheus/prometheus.yml:examples/prometheus/prometheus.yml
agent_env=()
for f in deploy/systemd/agent-*.env; do
  agent_env+=("$f:examples/$(basename "$f")")
done
tarball startline-agent \
  "deploy/systemd/startline-agent@.service:systemd/startline-agent@.service" \
  "${agent_env[@]}"

scripts/package-deb.sh --no-build --out "$out"
scripts/build-image.sh --no-build --out "$out/startline-$version-oci.tar"
python3 scripts/sbom.py --out "$out/startline-$version.cdx.json"

(cd "$out" && find . -maxdepth 1 -type f ! -name SHA256SUMS -printf '%f\n' | sort | xargs sha256sum > SHA256SUMS)
echo "release bundle: $out"
(cd "$out" && ls -l)
