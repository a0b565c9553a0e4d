#!/usr/bin/env bash
# Builds the container image from the Debian package (ADR-065), with
# nothing pulled from a container registry:
#   deploy/build-image.sh DEB OUT_DIR     # prints the image name
# mmdebstrap makes a minimal Debian 12 root (the Essential packages,
# ca-certificates, curl for the HEALTHCHECK) and installs DEB into it, so
# the package's postinst creates the `blobpool` user and /var/lib/blobpool;
# buildah turns that root into an image configured as deploy/Dockerfile's
# runtime stage is, and writes it twice:
#   OUT_DIR/blobpool-<version>.oci.tar     OCI archive (podman, skopeo, containerd)
#   OUT_DIR/blobpool-<version>.docker.tar  docker load (keeps the HEALTHCHECK,
#                                          which the OCI format has no field for)
# The image stays in buildah's local storage (vfs) as localhost/blobpool:<version>.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 DEB OUT_DIR" >&2; exit 2; }
deb=$(realpath "$1") out=$2
version=$(dpkg-deb --field "$deb" Version)
image=localhost/blobpool:$version
buildah=(buildah --storage-driver vfs)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mmdebstrap --quiet --variant=essential \
    --hook-dir=/usr/share/mmdebstrap/hooks/file-mirror-automount \
    --include="ca-certificates,curl,$deb" \
    bookworm "$work/rootfs.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
# The user the postinst created, by number (runAsNonRoot can check it).
ids=$(tar -xOf "$work/rootfs.tar" ./etc/passwd | awk -F: '$1 == "blobpool" { print $3 ":" $4 }')
[ -n "$ids" ] || { echo "the package created no blobpool user" >&2; exit 1; }

ctr=$("${buildah[@]}" from scratch)
"${buildah[@]}" add "$ctr" "$work/rootfs.tar" / >/dev/null
# As deploy/Dockerfile: the config every command reads, 0.0.0.0:7070 (the
# server refuses it without keys), the data directory as volume and working
# directory, a HEALTHCHECK on /health (http, then https for [tls]).
"${buildah[@]}" config \
    --user "$ids" --workingdir /var/lib/blobpool --volume /var/lib/blobpool --port 7070 \
    --env BLOBPOOL_CONFIG=/etc/blobpool/blobpool.toml --env BLOBPOOL_LISTEN=0.0.0.0:7070 \
    --entrypoint '["/usr/bin/blobpool"]' --cmd serve --stop-signal SIGTERM \
    --healthcheck "CMD-SHELL \"curl -fsS -o /dev/null -H 'Host: localhost' http://127.0.0.1:7070/health || curl -fsSk -o /dev/null -H 'Host: localhost' https://127.0.0.1:7070/health || exit 1\"" \
    --healthcheck-interval 30s --healthcheck-timeout 5s \
    --healthcheck-start-period 30s --healthcheck-retries 3 \
    --label org.opencontainers.image.title=blobpool \
    --label org.opencontainers.image.version="$version" \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "$ctr"
"${buildah[@]}" rmi --force "$image" >/dev/null 2>&1 || true   # one copy in storage
"${buildah[@]}" commit --quiet --format docker --rm "$ctr" "$image" >/dev/null
mkdir -p "$out"
rm -f "$out/blobpool-$version.oci.tar" "$out/blobpool-$version.docker.tar"
"${buildah[@]}" push --quiet "$image" "oci-archive:$out/blobpool-$version.oci.tar:$version"
"${buildah[@]}" push --quiet "$image" "docker-archive:$out/blobpool-$version.docker.tar:blobpool:$version"
echo "$image"
