#!/usr/bin/env bash
# The build-cache benchmarks of issue 31 (docs/BENCHMARKS.md, "Build cache"):
#
# 1. ccache: a rebuild whose every object is a remote hit through
#    `blobpool serve` (remote_only, so ccache's local directory is not
#    used) against the same rebuild with a warm local-directory ccache
#    (its fastest path: every object a local hit). Rounds interleave the
#    two sides; medians and the spread are printed.
# 2. HTTP: GET and PUT of 1 KiB and 1 MiB bodies through Blobpool's
#    /cache/ route against nginx serving / accepting (WebDAV PUT) the same
#    files on this machine, both driven by the same client (wrk, same
#    threads and connections, same duration), interleaved per round.
#
# Durability, stated: Blobpool runs its default store (SQLite kv with
# synchronous=NORMAL in WAL, local large tier, fsync = true on publish);
# nginx's PUT writes a temp file and renames it, no fsync; the local ccache
# writes files without fsync. Reads are from the page cache on both sides.
#
# Usage: bench/cache/run.sh [--quick]   (via `cargo xtask bench-cache`)
# Needs: ccache, nginx (nginx-light), wrk (Debian packages), gcc.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
QUICK=0
[ "${1:-}" = "--quick" ] && QUICK=1
ROUNDS=$([ $QUICK = 1 ] && echo 3 || echo 5)
UNITS=$([ $QUICK = 1 ] && echo 40 || echo 120)
DUR=$([ $QUICK = 1 ] && echo 3s || echo 8s)
for t in ccache nginx wrk gcc; do
  command -v $t >/dev/null || { echo "bench-cache: $t is not installed (apt-get install ccache nginx-light wrk gcc)" >&2; exit 1; }
done
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
cargo build --release -q -p blobpool
BIN=$TARGET/release/blobpool
W=$(mktemp -d /tmp/blobpool-bench-cache.XXXXXX)
cleanup() {
  [ -n "${BP_PID:-}" ] && kill "$BP_PID" 2>/dev/null || true
  [ -f "$W/nginx.conf" ] && nginx -c "$W/nginx.conf" -p "$W" -e "$W/nginx-error.log" -s stop 2>/dev/null || true
  sleep 0.5
  rm -rf "$W"
}
trap cleanup EXIT

# --- the servers -----------------------------------------------------------
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
BP_PORT=$(free_port); NG_PORT=$(free_port)
while [ "$NG_PORT" = "$BP_PORT" ]; do NG_PORT=$(free_port); done
cat > "$W/blobpool.toml" <<TOML
data_dir = "$W/bp-data"
listen = "127.0.0.1:$BP_PORT"
log_format = "json"
[gc]
interval = "off"
[gc.namespaces.cc]
policy = "cache"
[gc.namespaces.http]
policy = "cache"
TOML
RUST_LOG=warn "$BIN" --config "$W/blobpool.toml" serve 2>"$W/blobpool.log" &
BP_PID=$!
mkdir -p "$W/www/files" "$W/nginx-tmp"
# nginx's workers run as this user (as root it would drop to nobody, who
# cannot read the private temporary directory and would answer 403s).
chmod 0755 "$W"
cat > "$W/nginx.conf" <<NGINX
user $(id -un) $(id -gn);
worker_processes 2;
pid $W/nginx.pid;
error_log $W/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  client_body_temp_path $W/nginx-tmp;
  client_max_body_size 64m;
  server {
    listen 127.0.0.1:$NG_PORT;
    root $W/www;
    location /files/ { dav_methods PUT; create_full_put_path on; }
  }
}
NGINX
nginx -c "$W/nginx.conf" -p "$W" -e "$W/nginx-error.log" || { echo "bench-cache: nginx did not start:" >&2; cat "$W/nginx-error.log" >&2; exit 1; }
for _ in $(seq 1 50); do
  curl -fsS -o /dev/null "http://127.0.0.1:$BP_PORT/health" 2>/dev/null && break; sleep 0.2
done

median() { sort -n | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.4f", m}'; }
spread() { sort -n | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.4f-%.4f", lo, hi}'; }

# --- 1. ccache ---------------------------------------------------------------
SRC=$W/src; mkdir -p "$SRC"
for i in $(seq 1 $UNITS); do
  cat > "$SRC/u$i.c" <<C
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int table$i[256];
int work$i(const char *s) { int h = $i; for (size_t k = 0; k < strlen(s); k++) { h = h * 31 + s[k]; table$i[k & 255] += h; } return h; }
void show$i(void) { printf("%d\n", work$i("unit $i")); }
C
done
build() { # $1: out dir; env from the caller
  mkdir -p "$1"
  for f in "$SRC"/*.c; do ccache gcc -O2 -c "$f" -o "$1/$(basename "$f" .c).o"; done
}
export CCACHE_BASEDIR=$W CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS=time_macros
# Warm both: the local directory and the remote.
CCACHE_DIR=$W/ccache-local build "$W/o-warm-local"
CCACHE_DIR=$W/ccache-remote CCACHE_REMOTE_STORAGE="http://127.0.0.1:$BP_PORT/cache/cc" CCACHE_REMOTE_ONLY=true build "$W/o-warm-remote"
LOCAL=(); REMOTE=()
for r in $(seq 1 $ROUNDS); do
  CCACHE_DIR=$W/ccache-local ccache -z >/dev/null
  t0=$(date +%s.%N); CCACHE_DIR=$W/ccache-local build "$W/o-l$r"; t1=$(date +%s.%N)
  LOCAL+=("$(echo "$t1 - $t0" | bc)")
  CCACHE_DIR=$W/ccache-remote ccache -z >/dev/null
  t0=$(date +%s.%N)
  CCACHE_DIR=$W/ccache-remote CCACHE_REMOTE_STORAGE="http://127.0.0.1:$BP_PORT/cache/cc" CCACHE_REMOTE_ONLY=true build "$W/o-r$r"
  t1=$(date +%s.%N)
  REMOTE+=("$(echo "$t1 - $t0" | bc)")
  hits=$(CCACHE_DIR=$W/ccache-remote ccache --print-stats | awk -F'\t' '$1=="remote_storage_hit"{print $2}')
  lhits=$(CCACHE_DIR=$W/ccache-local ccache --print-stats | awk -F'\t' '$1=="local_storage_hit"{print $2}')
  [ "$hits" -ge "$UNITS" ] || { echo "bench-cache: round $r: only $hits remote hits of $UNITS" >&2; exit 1; }
  [ "$lhits" -ge "$UNITS" ] || { echo "bench-cache: round $r: only $lhits local hits of $UNITS" >&2; exit 1; }
done
lm=$(printf '%s\n' "${LOCAL[@]}" | median); rm_=$(printf '%s\n' "${REMOTE[@]}" | median)
echo "| ccache rebuild, $UNITS units, all hits | local dir $lm s ($(printf '%s\n' "${LOCAL[@]}" | spread)) | Blobpool remote_only $rm_ s ($(printf '%s\n' "${REMOTE[@]}" | spread)) | $(echo "scale=3; $rm_ / $lm" | bc)× the local time (target ≤ 1.2×) |"

# --- 2. HTTP GET / PUT against nginx -----------------------------------------
for size in 1024 1048576; do
  head -c $size /dev/urandom > "$W/body-$size"
  cp "$W/body-$size" "$W/www/files/obj-$size"
  curl -fsS -o /dev/null -X PUT --data-binary @"$W/body-$size" "http://127.0.0.1:$BP_PORT/cache/http/obj-$size"
  # Both sides answer the same bytes.
  for url in "http://127.0.0.1:$BP_PORT/cache/http/obj-$size" "http://127.0.0.1:$NG_PORT/files/obj-$size"; do
    curl -fsS "$url" | cmp -s - "$W/body-$size" || { echo "bench-cache: $url does not answer the body" >&2; exit 1; }
  done
done
cat > "$W/put.lua" <<'LUA'
-- Unique key and body per request: neither side can skip the write.
local counter = 0
local base = nil
function init(args) local f = io.open(args[1], "rb"); base = f:read("*all"); f:close(); prefix = args[2] end
function request()
  counter = counter + 1
  local tag = string.format("%d-%d-", math.random(1, 2^30), counter)
  return wrk.format("PUT", prefix .. tag, nil, tag .. base:sub(#tag + 1))
end
LUA
rate() { # $@: wrk args; prints requests/s and p99; any non-2xx answer fails the run
  out=$(wrk --latency "$@" 2>&1)
  if echo "$out" | grep -q "Non-2xx"; then
    echo "bench-cache: non-2xx answers from wrk $*:" >&2; echo "$out" >&2; echo FAIL FAIL; return
  fi
  echo "$out" | awk '/Requests\/sec/{r=$2} /^ +99%/{p=$2} END {print r, p}'
}
for op in GET PUT; do
  for size in 1024 1048576; do
    label=$([ $size = 1024 ] && echo "1 KiB" || echo "1 MiB")
    B=(); N=(); BP99=(); NP99=()
    for r in $(seq 1 $ROUNDS); do
      if [ $op = GET ]; then
        read -r b bp < <(rate -t2 -c16 -d$DUR "http://127.0.0.1:$BP_PORT/cache/http/obj-$size")
        read -r n np < <(rate -t2 -c16 -d$DUR "http://127.0.0.1:$NG_PORT/files/obj-$size")
      else
        read -r b bp < <(rate -t2 -c16 -d$DUR -s "$W/put.lua" "http://127.0.0.1:$BP_PORT" -- "$W/body-$size" "/cache/http/put-$size-")
        read -r n np < <(rate -t2 -c16 -d$DUR -s "$W/put.lua" "http://127.0.0.1:$NG_PORT" -- "$W/body-$size" "/files/put-$size-")
        rm -f "$W"/www/files/put-* 2>/dev/null || true
      fi
      [ "$b" != FAIL ] && [ "$n" != FAIL ] || exit 1
      B+=("$b"); N+=("$n"); BP99+=("$bp"); NP99+=("$np")
    done
    bm=$(printf '%s\n' "${B[@]}" | median); nm=$(printf '%s\n' "${N[@]}" | median)
    echo "| HTTP $op $label, wrk -t2 -c16 | nginx $nm req/s ($(printf '%s\n' "${N[@]}" | spread)), p99 ${NP99[*]} | Blobpool $bm req/s ($(printf '%s\n' "${B[@]}" | spread)), p99 ${BP99[*]} | $(echo "scale=3; $bm / $nm" | bc)× nginx (target ≥ 0.7×) |"
  done
done
