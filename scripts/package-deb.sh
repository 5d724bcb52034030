#!/usr/bin/env bash
# Builds startline-collector_<version>_<arch>.deb and startline-agent_<version>_<arch>.deb with dpkg-deb from
# staged trees: the release binaries (stripped), the systemd units (deploy/systemd/), the example collector
# config and the agents' environment files as conffiles under /etc/startline/, and maintainer scripts that
# create the system user `startline`. Checked by tests/tests/packaging.rs (contents, control fields, scripts,
# lintian).
#
#   scripts/package-deb.sh [--out DIR] [--no-build]
#
# --out DIR     where the .deb files go (default: <target dir>/debian)
# --no-build    use the release binaries already in the target dir
set -euo pipefail
cd "$(dirname "$0")/.."

out=""
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    *) echo "package-deb.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

# The same command as the builder stage of deploy/Containerfile (a test keeps the two identical).
BUILD_CMD="cargo build --release --locked -p startline-collector -p startline-agent"
if [ "$build" = 1 ]; then
  $BUILD_CMD
fi
target_dir=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
version=$(cargo metadata --format-version 1 --no-deps --locked | python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="startline-collector"))')
arch=$(dpkg --print-architecture)
out=${out:-$target_dir/debian}
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# Debian's DEBFULLNAME/DEBEMAIL name the maintainer; set them for a real release (the default is a placeholder).
maintainer="${DEBFULLNAME:-Startline maintainers} <${DEBEMAIL:-maintainers@startline.example.org}>"

# Dependencies of a binary from its shared libraries (dpkg-shlibdeps wants a debian/control to sit beside).
shlibs() {
  local bin="$1" dir
  dir=$(mktemp -d)
  mkdir -p "$dir/debian"
  printf 'Source: startline\n\nPackage: startline\nArchitecture: any\n' > "$dir/debian/control"
  (cd "$dir" && dpkg-shlibdeps -O "$bin" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
  rm -rf "$dir"
}

# The maintainer scripts both packages share: a system user and group `startline`, and /etc/startline readable
# by it (the config holds token hashes and the TLS key's path, not secrets, but is nobody else's business).
write_postinst() {
  local pkg="$1" state="$2" unit="$3" stop="$4"
  cat > "$stage/$pkg/DEBIAN/postinst" <<EOF
#!/bin/sh
set -e
if [ "\$1" = configure ]; then
    if ! getent passwd startline >/dev/null; then
        adduser --system --group --home /nonexistent --no-create-home --quiet startline
    fi
    chown root:startline /etc/startline
    chmod 0750 /etc/startline
    for f in /etc/startline/*.toml /etc/startline/*.env; do
        [ -e "\$f" ] || continue
        chown root:startline "\$f"
        chmod 0640 "\$f"
    done
    install -d -o startline -g startline -m 0750 $state
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
    fi
    echo "$pkg: edit /etc/startline and then: systemctl enable --now $unit"
fi
exit 0
EOF
  cat > "$stage/$pkg/DEBIAN/prerm" <<EOF
#!/bin/sh
set -e
if [ "\$1" = remove ] && [ -d /run/systemd/system ]; then
    for unit in $stop; do
        deb-systemd-invoke stop "\$unit" >/dev/null 2>&1 || true
    done
fi
exit 0
EOF
  cat > "$stage/$pkg/DEBIAN/postrm" <<EOF
#!/bin/sh
set -e
if [ "\$1" = purge ]; then
    # Purge deletes what this package stored (the collector's database, the agents' spools). The user stays:
    # files elsewhere may still belong to it.
    rm -rf $state
fi
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
exit 0
EOF
  chmod 0755 "$stage/$pkg/DEBIAN/postinst" "$stage/$pkg/DEBIAN/prerm" "$stage/$pkg/DEBIAN/postrm"
}

write_docs() {
  local pkg="$1" doc="$stage/$1/usr/share/doc/$1" overrides="$stage/$1/usr/share/lintian/overrides"
  # The conffiles are 0640 on purpose (postinst gives them to root:startline): they name credentials' files
  # and hold token hashes.
  install -d -m 0755 "$overrides"
  echo "$pkg: non-standard-file-perm 0640 != 0644 [etc/startline/*]" > "$overrides/$pkg"
  if [ "$pkg" = startline-agent ]; then
    # kube-rs (the Kueue adapter's Kubernetes client) reads kubeconfig files with serde_yaml, which links
    # unsafe-libyaml: a Rust translation of libyaml, not a copy of the C library, so there is no shared library
    # to link against instead.
    {
      echo "# unsafe-libyaml (Rust translation of libyaml, via kube-rs' kubeconfig parser): nothing to link instead"
      echo "$pkg: embedded-library libyaml [usr/bin/startline-agent]"
    } >> "$overrides/$pkg"
  fi
  chmod 0644 "$overrides/$pkg"
  install -d -m 0755 "$doc"
  install -m 0644 README.md "$doc/README.md"
  cat > "$doc/copyright" <<EOF
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: startline
Source: the Startline source tree

Files: *
Copyright: 2025-2026 Startline contributors
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
EOF
  chmod 0644 "$doc/copyright"
  # A native package (no Debian revision): its changelog is changelog.gz.
  printf 'startline (%s) unstable; urgency=medium\n\n  * Release %s; see CHANGELOG.md in the source.\n\n -- %s  %s\n' \
    "$version" "$version" "$maintainer" "$(date -R -u -d @"${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")" \
    | gzip -9n > "$doc/changelog.gz"
  chmod 0644 "$doc/changelog.gz"
}

write_control() {
  local pkg="$1" bin="$2" description="$3"
  local deps size
  deps=$(shlibs "$stage/$pkg/usr/bin/$bin")
  size=$(du -sk --exclude=DEBIAN "$stage/$pkg" | cut -f1)
  cat > "$stage/$pkg/DEBIAN/control" <<EOF
Package: $pkg
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: adduser${deps:+, $deps}
Section: admin
Priority: optional
Description: $description
EOF
}

stage_package() {
  local pkg="$1" bin="$2"
  install -d -m 0755 "$stage/$pkg/DEBIAN" "$stage/$pkg/usr/bin" "$stage/$pkg/lib/systemd/system" "$stage/$pkg/etc/startline"
  install -m 0755 "$target_dir/release/$bin" "$stage/$pkg/usr/bin/$bin"
  strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stage/$pkg/usr/bin/$bin"
  write_docs "$pkg"
}

# startline-collector
stage_package startline-collector startline-collector
install -m 0644 deploy/systemd/startline-collector.service "$stage/startline-collector/lib/systemd/system/"
install -m 0640 deploy/collector.example.toml "$stage/startline-collector/etc/startline/collector.toml"
echo /etc/startline/collector.toml > "$stage/startline-collector/DEBIAN/conffiles"
write_postinst startline-collector /var/lib/startline startline-collector.service startline-collector.service
write_control startline-collector startline-collector "Startline collector: measures the wait before ML training jobs start
 Receives job lifecycle events over gRPC, stores them durably and builds each
 job's timeline (waiting for capacity, image, data, first step), with start
 SLOs, alerts, Prometheus metrics, an HTTP API and a dashboard."

# startline-agent
stage_package startline-agent startline-agent
install -m 0644 'deploy/systemd/startline-agent@.service' "$stage/startline-agent/lib/systemd/system/"
: > "$stage/startline-agent/DEBIAN/conffiles"
for i in node slurm sagemaker vertex azureml; do
  install -m 0640 "deploy/systemd/agent-$i.env" "$stage/startline-agent/etc/startline/agent-$i.env"
  echo "/etc/startline/agent-$i.env" >> "$stage/startline-agent/DEBIAN/conffiles"
done
write_postinst startline-agent /var/lib/startline-agent 'startline-agent@<node|slurm|sagemaker|vertex|azureml>.service' \
  'startline-agent@node.service startline-agent@slurm.service startline-agent@sagemaker.service startline-agent@vertex.service startline-agent@azureml.service'
write_control startline-agent startline-agent "Startline agents: job lifecycle events for the Startline collector
 The node agent (a local endpoint for training loops) and the Slurm,
 SageMaker, Vertex AI and Azure Machine Learning adapters, each with a
 durable spool that delivers events to the collector over gRPC."

for pkg in startline-collector startline-agent; do
  dpkg-deb --root-owner-group -Zxz --build "$stage/$pkg" "$out/${pkg}_${version}_${arch}.deb" >/dev/null
  echo "$out/${pkg}_${version}_${arch}.deb"
done
