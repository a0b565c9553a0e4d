# What the build-cache benchmarks (bench/cache/run.sh, bench/cache/bazel.sh)
# share: the release `blobpool`, free ports, Blobpool and nginx WebDAV
# servers of their own in the work directory $W, and the worst-round
# verdict (ADR-051). Sourced, not run; the caller sets `set -euo pipefail`,
# BENCH (its name in messages, e.g. "bench-cache"), ROOT (the repository)
# and W (its temporary directory), and QUICK for `run_footer`.

# Sets BIN: $BENCH_CACHE_BLOBPOOL, else a fresh `cargo build --release`.
blobpool_bin() {
  if [ -n "${BENCH_CACHE_BLOBPOOL:-}" ]; then
    BIN=$BENCH_CACHE_BLOBPOOL
  else
    cargo build --release -q -p blobpool
    BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/blobpool
  fi
}

# Notes the start (START, LOAD0, T_START) for `run_footer`.
run_start() {
  START=$(date -u '+%Y-%m-%d %H:%M UTC'); LOAD0=$(cut -d' ' -f1 /proc/loadavg); T_START=$(date +%s)
}

# The closing "Run: ..." line: start, CPUs, load, duration.
run_footer() {
  echo "Run: $START, $(nproc) CPUs, load average $LOAD0 at start / $(cut -d' ' -f1 /proc/loadavg) at end, $(( $(date +%s) - T_START )) s$([ "$QUICK" = 1 ] && echo ", --quick")."
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_blobpool PORT NS...: `blobpool serve` ($BIN) on PORT, data in
# $W/bp-data, GC off, NS... its cache namespaces; log in $W/blobpool.log.
# Sets BP_PID; `wait_blobpool` waits for it.
start_blobpool() {
  local port=$1 ns
  shift
  {
    printf 'data_dir = "%s"\nlisten = "127.0.0.1:%s"\nlog_format = "json"\n[gc]\ninterval = "off"\n' "$W/bp-data" "$port"
    for ns in "$@"; do printf '[gc.namespaces.%s]\npolicy = "cache"\n' "$ns"; done
  } > "$W/blobpool.toml"
  RUST_LOG=warn "$BIN" --config "$W/blobpool.toml" serve 2>"$W/blobpool.log" &
  BP_PID=$!
  BP_PORT=$port
}

# Waits (10 s at most) for `start_blobpool`'s server to answer /health; exits otherwise.
wait_blobpool() {
  for _ in $(seq 1 50); do curl -fsS -o /dev/null "http://127.0.0.1:$BP_PORT/health" 2>/dev/null && return; sleep 0.2; done
  curl -fsS -o /dev/null "http://127.0.0.1:$BP_PORT/health" || { echo "$BENCH: blobpool did not start:" >&2; cat "$W/blobpool.log" >&2; exit 1; }
}

# start_nginx PORT LOCATION...: nginx (WebDAV) on PORT serving $W/www, each
# LOCATION one `location` line of its server block; pid in $W/nginx.pid.
# Its workers run as this user (as root it would drop to nobody, who cannot
# read the private temporary directory and would answer 403s).
# open_file_cache caches found files only (no open_file_cache_errors): a
# cached "not found" would turn a rebuild's hits into misses after a PUT.
start_nginx() {
  local port=$1 loc
  shift
  mkdir -p "$W/www" "$W/nginx-tmp"
  chmod 0755 "$W"
  {
    cat <<NGINX
user $(id -un) $(id -gn);
worker_processes 2;
pid $W/nginx.pid;
error_log $W/nginx-error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  tcp_nodelay on;
  open_file_cache max=10000 inactive=60s;
  open_file_cache_valid 60s;
  client_body_temp_path $W/nginx-tmp;
  client_max_body_size 64m;
  server {
    listen 127.0.0.1:$port;
    root $W/www;
NGINX
    for loc in "$@"; do echo "    $loc"; done
    printf '  }\n}\n'
  } > "$W/nginx.conf"
  nginx -c "$W/nginx.conf" -p "$W" -e "$W/nginx-error.log" || { echo "$BENCH: nginx did not start:" >&2; cat "$W/nginx-error.log" >&2; exit 1; }
}

# stop_servers KEEP: for the EXIT trap, stops the servers `start_blobpool`
# and `start_nginx` started, then removes $W unless the variable named KEEP
# is set.
stop_servers() {
  [ -n "${BP_PID:-}" ] && kill "$BP_PID" 2>/dev/null || true
  [ -f "$W/nginx.pid" ] && nginx -c "$W/nginx.conf" -p "$W" -e "$W/nginx-error.log" -s stop 2>/dev/null || true
  sleep 0.5
  [ -n "${!1:-}" ] || rm -rf "$W"
}

median() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.3f", m}'; }
maxof() { sort -g | tail -1; }
div() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a / b}'; }
# verdict TARGET VALUES... : an at-most target under the worst-round rule.
verdict() {
  local t=$1; shift
  local worst med
  worst=$(printf '%s\n' "$@" | maxof); med=$(printf '%s\n' "$@" | median)
  if awk -v w="$worst" -v t="$t" 'BEGIN {exit !(w <= t)}'; then echo "met (worst round $worst×)"
  elif awk -v m="$med" -v t="$t" 'BEGIN {exit !(m <= t)}'; then echo "**not proven** (median $med×, worst round $worst×)"
  else echo "**missed** (median $med×, worst round $worst×)"; fi
}
