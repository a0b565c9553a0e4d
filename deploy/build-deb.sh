#!/usr/bin/env bash
# Builds the Debian package from a built blobpool binary (ADR-065):
#   deploy/build-deb.sh BINARY OUT_DIR      # prints OUT_DIR/blobpool_<version>_<arch>.deb
# `cargo xtask package --release` builds the release binary and runs this;
# CI packages the dev-profile binary its tests built. The package installs
#   /usr/bin/blobpool                      (stripped)
#   /lib/systemd/system/blobpool.service   (deploy/blobpool.service, not enabled)
#   /etc/blobpool/blobpool.toml            (deploy/blobpool.toml, a conffile, root:blobpool 0640)
#   /usr/share/doc/blobpool/copyright      (deploy/debian/copyright: Apache-2.0)
#   /usr/share/doc/blobpool/changelog.gz   (CHANGELOG.md)
# and its postinst (deploy/debian/postinst) creates the `blobpool` system
# user and /var/lib/blobpool (blobpool:blobpool 0700).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BINARY OUT_DIR" >&2; exit 2; }
bin=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
version=$("$bin" --version | awk '{print $2}')
arch=$(dpkg --print-architecture)
root=$(mktemp -d)
chmod 0755 "$root"
trap 'rm -rf "$root"' EXIT

install -D -m 0755 "$bin" "$root/usr/bin/blobpool"
strip --strip-unneeded "$root/usr/bin/blobpool"
sed 's|/usr/local/bin/blobpool|/usr/bin/blobpool|' "$here/blobpool.service" |
    install -D -m 0644 /dev/stdin "$root/lib/systemd/system/blobpool.service"
install -D -m 0640 "$here/blobpool.toml" "$root/etc/blobpool/blobpool.toml"
chmod 0750 "$root/etc/blobpool"
install -D -m 0644 "$here/debian/copyright" "$root/usr/share/doc/blobpool/copyright"
gzip -9n <"$here/../CHANGELOG.md" >"$root/usr/share/doc/blobpool/changelog.gz"
install -d -m 0755 "$root/DEBIAN"
install -m 0755 "$here/debian/postinst" "$here/debian/prerm" "$root/DEBIAN/"
echo /etc/blobpool/blobpool.toml >"$root/DEBIAN/conffiles"
cat >"$root/DEBIAN/control" <<CONTROL
Package: blobpool
Version: $version
Architecture: $arch
Maintainer: Blobpool maintainers <maintainers@users.noreply.a-seed-926cb92a.example>
Installed-Size: $(du -sk --exclude=DEBIAN "$root" | cut -f1)
Depends: libc6 (>= 2.34), libgcc-s1, adduser
Recommends: ca-certificates
Section: net
Priority: optional
Description: content-addressed blob store: artefact store and build cache
 The blobpool server and command line: a content-addressed blob store with
 garbage collection, references, resumable uploads and build-cache
 namespaces (ccache, sccache, Gradle, Bazel), over HTTP.
 .
 The service is installed but not enabled: add API keys to
 /etc/blobpool/blobpool.toml (blobpool key new), then
 systemctl enable --now blobpool.
CONTROL
mkdir -p "$out"
deb="$out/blobpool_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zgzip --build "$root" "$deb" >/dev/null
echo "$deb"
