#!/usr/bin/env bash
# Builds the Startline container image without pulling anything, and writes it as an OCI archive: a
# distroless-like root file system assembled from this Debian system's own packages (exactly the shared
# libraries `ldd` names for the two binaries, the CA bundle, the time zone database, and each package's
# copyright file and dpkg status for scanners), the release binaries, the image's collector config, a non-root
# user `nonroot` (65532:65532) and /var/lib/startline as the volume, committed by buildah from `scratch`.
# deploy/Containerfile is the same image for machines that can pull `rust:` and distroless images; tests/tests/
# container.rs checks that both install the same files and settings, and starts this archive's collector from
# its own root file system.
#
#   scripts/build-image.sh [--out FILE] [--no-build] [--bin-dir DIR]
#
# --out FILE     the OCI archive (default: <target dir>/image/startline-<version>-oci.tar)
# --no-build     use the release binaries already in the target dir
# --bin-dir DIR  take startline-collector and startline-agent from DIR (implies --no-build)
#
# Load it with `podman load -i FILE` or push it with `skopeo copy oci-archive:FILE docker://REGISTRY/startline:TAG`.
# Labels: org.opencontainers.image.{title,description,version,revision,source,licenses,created}; `created` is
# SOURCE_DATE_EPOCH when set, else the commit's time (the same commit gives the same label); `source` is
# STARTLINE_SOURCE_URL, else the git remote `origin`.
set -euo pipefail
cd "$(dirname "$0")/.."

out=""
build=1
bin_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --no-build) build=0; shift ;;
    --bin-dir) bin_dir="$2"; build=0; shift 2 ;;
    *) echo "build-image.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for tool in buildah ldd dpkg-query strip; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build-image.sh: $tool is needed (Debian: apt-get install buildah binutils)" >&2; exit 69; }
done

# The same command as the builder stage of deploy/Containerfile (a test keeps the two identical).
BUILD_CMD="cargo build --release --locked -p startline-collector -p startline-agent"
if [ "$build" = 1 ]; then
  $BUILD_CMD
fi
meta=$(cargo metadata --format-version 1 --no-deps --locked)
target_dir=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' <<<"$meta")
version=$(python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="startline-collector"))' <<<"$meta")
bin_dir=${bin_dir:-$target_dir/release}
out=${out:-$target_dir/image/startline-$version-oci.tar}
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
source_url=${STARTLINE_SOURCE_URL:-$(git config --get remote.origin.url 2>/dev/null || echo https://startline.example.org/source)}
arch=$(dpkg --print-architecture)

work=$(mktemp -d)
cleanup() {
  # buildah's vfs storage holds root-owned copies of the layer: remove the whole scratch directory.
  rm -rf "$work"
}
trap cleanup EXIT
root="$work/rootfs"
mkdir -p "$root"/{usr/bin,usr/lib,usr/sbin,etc/ssl/certs,etc/startline,usr/share/doc,var/lib/dpkg/status.d,home/nonroot,tmp}
# Debian's merged /usr layout: the paths ldd prints (/lib/..., /lib64/...) resolve as on the build host.
ln -s usr/bin "$root/bin"
ln -s usr/sbin "$root/sbin"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
mkdir -p "$root/usr/lib64"

bins=(startline-collector startline-agent)
for b in "${bins[@]}"; do
  [ -x "$bin_dir/$b" ] || { echo "build-image.sh: $bin_dir/$b is missing (run: $BUILD_CMD)" >&2; exit 1; }
  # As the Containerfile: debug info stripped, symbols kept (backtraces name functions).
  strip --strip-debug -o "$root/usr/bin/$b" "$bin_dir/$b"
done

# Exactly the libraries the binaries load, at the paths the dynamic loader looks for them.
libs=$(for b in "${bins[@]}"; do ldd "$bin_dir/$b"; done | grep -oE '/[^ ]+' | sort -u)
pkgs=()
for lib in $libs; do
  # Under the name ldd printed (a soname symlink becomes the file it points to).
  dest="$root/usr${lib#/usr}"
  mkdir -p "$(dirname "$dest")"
  cp -L "$lib" "$dest"
  pkgs+=("$(dpkg-query -S "$lib" 2>/dev/null | head -1 | cut -d: -f1 || true)")
done

# CA certificates (the bundle update-ca-certificates made from Debian's ca-certificates) and the time zone
# database (tzdata), as the Containerfile's distroless base and builder stage provide them.
cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
cp -a /usr/share/zoneinfo "$root/usr/share/zoneinfo"
pkgs+=(ca-certificates tzdata)

# What a scanner reads to know the packages (distroless's layout: one status file per package), and every
# package's copyright file.
for p in $(printf '%s\n' "${pkgs[@]}" | grep -v '^$' | sort -u); do
  dpkg-query -s "$p" > "$root/var/lib/dpkg/status.d/$p"
  mkdir -p "$root/usr/share/doc/$p"
  cp -L "/usr/share/doc/$p/copyright" "$root/usr/share/doc/$p/copyright"
done
mkdir -p "$root/usr/share/doc/startline"
cp LICENSE "$root/usr/share/doc/startline/LICENSE"

# The non-root user (distroless's nonroot, 65532) and the image's config and volume.
cat > "$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$root/etc/group" <<'EOF'
root:x:0:
nonroot:x:65532:
EOF
cp deploy/container/collector.toml "$root/etc/startline/collector.toml"
mkdir -p "$root/var/lib/startline"
chown 65532:65532 "$root/var/lib/startline" "$root/home/nonroot"
chmod 0700 "$root/home/nonroot"
chmod 1777 "$root/tmp"

B=(buildah --root "$work/storage" --runroot "$work/run" --storage-driver vfs)
ctr=$("${B[@]}" from scratch)
mnt=$("${B[@]}" mount "$ctr")
cp -a "$root/." "$mnt/"
"${B[@]}" umount "$ctr" >/dev/null
"${B[@]}" config \
  --os linux --arch "$arch" \
  --user 65532:65532 \
  --workingdir /var/lib/startline \
  --volume /var/lib/startline \
  --env STARTLINE_CONFIG=/etc/startline/collector.toml \
  --port 50051 --port 8080 \
  --entrypoint '["/usr/bin/startline-collector"]' \
  --cmd '["run"]' \
  --label org.opencontainers.image.title=startline \
  --label "org.opencontainers.image.description=Startline: measures the wait before ML training jobs start" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --label "org.opencontainers.image.source=$source_url" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label "org.opencontainers.image.created=$created" \
  --created-by "scripts/build-image.sh: Debian $(cut -d. -f1 /etc/debian_version) libraries, CA certificates, tzdata; startline $version" \
  "$ctr"
rm -f "$out"
"${B[@]}" commit --quiet --format oci --disable-compression=false --timestamp "$epoch" --rm "$ctr" "oci-archive:$out:startline:$version" >/dev/null
echo "image: $out ($(du -k "$out" | cut -f1) KiB archive, $(du -sk "$root" | cut -f1) KiB root file system)"
