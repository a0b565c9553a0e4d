#!/usr/bin/env bash
# What one GET costs the server, counted instead of timed (ADR-073): the
# instructions and the heap allocations of `blobpool serve` per request,
# under valgrind's callgrind, so the figure does not move with the load of
# a shared machine (this VM exposes no hardware counters to `perf stat`).
#
# The server runs the default store (SQLite kv, local large) with the
# configuration of `bench-http`. 200 entries of 1 KiB are put by digest
# into `anchor` and as cache keys `/cache/cc/k/{i}`; both are read once
# (warm-up: page cache, hot-entry cache, remembered keys). Then, counters
# zeroed between phases, N GETs of each kind over one keep-alive
# connection (curl), cycling through the 200 entries:
#   digest  GET /v1/blobs/anchor/{digest}
#   cache   GET /cache/cc/k/{i}
# Each phase's totals (every thread of the server) ÷ N are printed: Ir
# (instructions executed) and allocations (calls of malloc, calloc,
# realloc, posix_memalign, aligned_alloc).
#
# Usage: bench/get_cost.sh [BLOBPOOL_BINARY]   (default target/release/blobpool)
# Env: N (requests per phase, default 2000), KEEP=1 keeps the work
# directory (the callgrind dumps: callgrind_annotate them).
# Needs: valgrind, curl, python3 (Debian packages).
set -euo pipefail
cd "$(dirname "$0")/.."
BP=${1:-${CARGO_TARGET_DIR:-$PWD/target}/release/blobpool}
N=${N:-2000}
for tool in valgrind callgrind_control curl python3; do
  command -v "$tool" >/dev/null || { echo "get_cost: $tool is not installed (apt-get install valgrind curl python3)" >&2; exit 1; }
done
[ -x "$BP" ] || { echo "get_cost: $BP is missing (cargo build --release -p blobpool)" >&2; exit 1; }
W=$(mktemp -d /tmp/blobpool-get-cost-XXXXXX)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$W/blobpool.toml" <<EOF
data_dir = "$W/bp-data"
listen = "127.0.0.1:$PORT"
log_format = "json"
window = "0s"
token_ttl = "1s"
max_tokens = 1000000
max_tokens_per_identity = 1000000
[gc]
interval = "off"
[gc.namespaces.cc]
policy = "cache"
EOF
RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$W/cg.out" \
  "$BP" --config "$W/blobpool.toml" serve >"$W/server.log" 2>&1 &
VG=$!
cleanup() {
  kill "$VG" 2>/dev/null || true
  wait "$VG" 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "get_cost: kept $W" >&2; else rm -rf "$W"; fi
}
trap cleanup EXIT
B="http://127.0.0.1:$PORT"
for _ in $(seq 1 240); do
  curl -sf "$B/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -sf "$B/health" >/dev/null || { echo "get_cost: the server did not start:" >&2; cat "$W/server.log" >&2; exit 1; }

: >"$W/digest.1"; : >"$W/cache.1"
for i in $(seq 0 199); do
  head -c 1024 /dev/urandom >"$W/body"
  d=$(curl -sf -X PUT -H 'content-type: application/octet-stream' --data-binary @"$W/body" \
    "$B/v1/blobs/anchor" | python3 -c 'import json,sys; print(json.load(sys.stdin)["digest"])')
  curl -sf -X PUT --data-binary @"$W/body" "$B/cache/cc/k/$i" >/dev/null
  echo "url = \"$B/v1/blobs/anchor/$d\"" >>"$W/digest.1"
  echo "url = \"$B/cache/cc/k/$i\"" >>"$W/cache.1"
done
for kind in digest cache; do
  for _ in $(seq 1 $(( (N + 199) / 200 ))); do cat "$W/$kind.1"; done | head -n "$N" \
    | sed 's/$/\noutput = "\/dev\/null"/' >"$W/$kind.curl"
  # Warm-up: every entry once.
  sed 's/$/\noutput = "\/dev\/null"/' "$W/$kind.1" | curl -sf -K - >/dev/null
done

callgrind_control -z "$VG" >/dev/null 2>&1
for kind in digest cache; do
  curl -sf -K "$W/$kind.curl" >/dev/null
  callgrind_control -d "$kind" "$VG" >/dev/null 2>&1
done
kill -INT "$VG" 2>/dev/null || true
wait "$VG" 2>/dev/null || true

python3 - "$W" "$N" <<'PY'
import glob, re, sys
w, n = sys.argv[1], int(sys.argv[2])
ALLOC = {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc"}
rows = []
for path in sorted(glob.glob(f"{w}/cg.out.*"), key=lambda p: int(p.rsplit(".", 1)[1])):
    desc, total, allocs, names, cfn = "", 0, 0, {}, None
    for line in open(path, errors="replace"):
        if line.startswith("desc: Trigger:"):
            desc = line.split("Trigger:", 1)[1].strip()
        elif line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
        elif line.startswith(("fn=", "cfn=")):
            # Names are compressed: "(id) name" the first time, "(id)" after.
            tag, _, rest = line.strip().partition("=")
            m = re.match(r"\((\d+)\)(?: (.*))?", rest)
            if m:
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                name = names.get(m.group(1), "")
            else:
                name = rest
            if tag == "cfn":
                cfn = name
        elif line.startswith("calls=") and cfn is not None:
            if cfn in ALLOC:
                allocs += int(line.split("=", 1)[1].split()[0])
            cfn = None
    rows.append((desc, total, allocs))
print(f"| phase | Ir per request | allocations per request |")
print(f"|---|---:|---:|")
for desc, total, allocs in rows:
    kind = re.sub(r"^dump ", "", desc)
    if kind not in ("digest", "cache"):
        continue
    print(f"| {kind} | {total / n:,.0f} | {allocs / n:.1f} |")
PY
