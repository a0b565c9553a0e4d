#!/usr/bin/env bash
# Runs the image built by build-image.sh and checks it answers (ADR-065):
#   deploy/check-image.sh IMAGE [COMMIT]
# In one `buildah run` (chroot isolation, the host's network), as the
# image's user, which must be the package's `blobpool`: the owners and
# modes the package gave the data directory and config, the unit's path
# to the binary, a key from
# `blobpool key new`, the image's ENTRYPOINT and CMD with that key
# (BLOBPOOL_AUTH_KEYS) on a free port in place of 7070, the image's own
# HEALTHCHECK command until it passes, GET /health, one put and one get of
# the same bytes, then SIGTERM and a clean exit. With COMMIT, `blobpool
# --version` must name it. Any failure exits non-zero.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 IMAGE [COMMIT]" >&2; exit 2; }
image=$1 commit=${2:-}
buildah=(buildah --storage-driver vfs)
config() {
    "${buildah[@]}" inspect --type image "$image" |
        python3 -c "import json, sys; c = json.load(sys.stdin)['Docker']['config']; print($1)"
}
healthcheck=$(config "c['Healthcheck']['Test'][1]")
command=$(config "' '.join(c['Entrypoint'] + c['Cmd'])")
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
ctr=$("${buildah[@]}" from "$image")
trap '"${buildah[@]}" rm "$ctr" >/dev/null' EXIT

# shellcheck disable=SC2016 # expanded inside the container
"${buildah[@]}" run --isolation chroot "$ctr" -- sh -euc '
    port=$1 commit=$2 healthcheck=$(echo "$3" | sed "s/:7070/:$port/g") command=$4
    [ "$(id -un)" = blobpool ] || { echo "runs as $(id -un), not blobpool"; exit 1; }
    # What the package installed (deploy/debian/postinst, build-deb.sh).
    modes=$(stat -c "%n %U:%G %a" /var/lib/blobpool /etc/blobpool /etc/blobpool/blobpool.toml)
    [ "$modes" = "/var/lib/blobpool blobpool:blobpool 700
/etc/blobpool root:blobpool 750
/etc/blobpool/blobpool.toml root:blobpool 640" ] || { echo "owners and modes: $modes"; exit 1; }
    grep -qx "ExecStart=/usr/bin/blobpool --config /etc/blobpool/blobpool.toml serve" \
        /lib/systemd/system/blobpool.service || { echo "the unit does not run /usr/bin/blobpool"; exit 1; }
    version=$(blobpool --version); echo "$version"
    [ -z "$commit" ] || echo "$version" | grep -q "(commit $commit)" ||
        { echo "--version does not name $commit"; exit 1; }
    new=$(blobpool key new --name smoke --scope read --scope write --json)
    key=$(echo "$new" | sed "s/.*\"key\":\"\([^\"]*\)\".*/\1/")
    hash=$(echo "$new" | sed "s/.*\"hash\":\"\([^\"]*\)\".*/\1/")
    BLOBPOOL_AUTH_KEYS="smoke=$hash=read,write" BLOBPOOL_LISTEN="0.0.0.0:$port" \
        $command 2>/tmp/serve.log &
    server=$!
    for _ in $(seq 100); do sh -c "$healthcheck" 2>/dev/null && break; sleep 0.2; done
    sh -c "$healthcheck" || { echo "HEALTHCHECK fails"; cat /tmp/serve.log; exit 1; }
    url=http://127.0.0.1:$port
    curl -fsS "$url/health" | grep -q "\"status\":\"ok\""
    put=$(printf "hello from the image" |
        curl -fsS -X PUT -H "Authorization: Bearer $key" --data-binary @- "$url/v1/blobs/smoke")
    digest=$(echo "$put" | sed "s/.*\"digest\":\"\([0-9a-f]*\)\".*/\1/")
    got=$(curl -fsS -H "Authorization: Bearer $key" "$url/v1/blobs/smoke/$digest")
    [ "$got" = "hello from the image" ] || { echo "get returned: $got"; exit 1; }
    kill -TERM "$server"; wait "$server" || { echo "serve exited $?"; cat /tmp/serve.log; exit 1; }
    echo "image ok: /health, put $digest, get, HEALTHCHECK, clean stop as $(id -un)"
' sh "$port" "$commit" "$healthcheck" "$command"
