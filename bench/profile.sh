#!/usr/bin/env bash
# Where the time goes in the rows issue 33's targets miss (docs/BENCHMARKS.md,
# "Issue 33: where the time goes"): a system-wide `perf record` (cpu-clock
# sampling: this VM exposes no hardware counters) while one part of a
# benchmark runs, then the top symbols by process and library.
#
# Usage: bench/profile.sh [OUT_DIR]   (after cargo build --release -p bench
#        --bins -p blobpool, and bench-skeptic populate for the workset part)
# Needs: perf (Debian package linux-perf), nginx-light.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${CARGO_TARGET_DIR:-$PWD/target}/release
OUT=${1:-/tmp/blobpool-profiles}
mkdir -p "$OUT"
command -v perf >/dev/null || { echo "profile: perf is not installed (apt-get install linux-perf)" >&2; exit 1; }

prof() { # name, command...
  local name=$1; shift
  perf record -e cpu-clock -F 1999 -a -o "$OUT/$name.data" -- "$@" >"$OUT/$name.out" 2>"$OUT/$name.log"
  perf report -i "$OUT/$name.data" --no-children --sort comm,dso --stdio 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | head -25 >"$OUT/$name.by-process.txt" || true
  perf report -i "$OUT/$name.data" --no-children --sort comm,sym --stdio 2>/dev/null \
    | grep -v '^#' | grep -v '^$' | head -60 >"$OUT/$name.by-symbol.txt" || true
  # bench-http names its servers' pids: one report per server (user and
  # kernel time of that process; nginx by name, for its workers).
  local pids
  pids=$(grep -o 'pids blobpool=[0-9]* nginx=[0-9]* static-server=[0-9]*' "$OUT/$name.log" || true)
  if [ -n "$pids" ]; then
    local bp hy
    bp=$(echo "$pids" | sed 's/.*blobpool=\([0-9]*\).*/\1/')
    hy=$(echo "$pids" | sed 's/.*static-server=\([0-9]*\).*/\1/')
    for who in "blobpool:--pid=$bp" "static-server:--pid=$hy" "nginx:--comm=nginx"; do
      perf report -i "$OUT/$name.data" --no-children "${who#*:}" --sort dso,sym --stdio 2>/dev/null \
        | grep -v '^#' | grep -v '^$' | head -40 >"$OUT/$name.${who%%:*}.txt" || true
    done
  fi
  echo "profile: $OUT/$name.*.txt"
}

# HTTP GETs of 4 KiB and of 64 MiB against nginx and the hyper server.
prof http-4k "$T/bench-http" --quick --only 4k
prof http-64m "$T/bench-http" --quick --only 64m
# The default composite's working-set 1 KiB gets alone (warm page cache;
# the profile includes the untimed pass that warms the stores).
prof workset-default-1k "$T/bench-skeptic" workset --reader 0 \
  --case "get 1 KiB (verified), uniform warm" --json "$OUT/workset-default-1k.json"
# The library mixed load with and without a sweep.
prof tail-library "$T/bench-skeptic" tail --quick --json "$OUT/tail-library.json"
