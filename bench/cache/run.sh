#!/usr/bin/env bash
# The build-cache benchmark (docs/BENCHMARKS.md, "Build cache"; issues 31
# and 40 item 6):
#
# 1. ccache's all-hits rebuild through four storages side by side, in
#    interleaved rounds (the order rotates every round):
#      local   ccache's own directory (its fastest path, no remote);
#      blobpool `blobpool serve` (release build), cache namespace `cc`;
#      nginx   WebDAV (`dav_methods PUT DELETE; create_full_put_path on`,
#              open_file_cache on, sendfile);
#      redis   a redis-server of this script's own (no persistence).
#    Per side and round: empty the storage, a cold build that fills it,
#    then (remotes) a fresh CCACHE_DIR with remote_only = true so the
#    local directory holds nothing, and the timed all-hits rebuild.
#    ccache's own statistics (--print-stats) must show every compile as a
#    direct hit from that storage (a hit from the remote for a remote),
#    no miss, no remote error or timeout, or the run fails.
#    Verdicts use the worst-round rule (ADR-051): a target is met only
#    when every round clears it; "not proven" when the median does and
#    some round does not; ratios are taken within a round only.
# 2. A GET on a fresh connection (ccache opens one per compiler process):
#    bench/cache/fresh_get.c connects, makes one GET (and, as ccache does
#    for a hit, two: manifest then result), closes; Blobpool vs nginx vs
#    redis, the same body, interleaved rounds; connect-to-close times.
# 3. With --http only: the old wrk GET/PUT rows against nginx (wrk shares
#    the cores with the servers; the pinned HTTP rows of record are
#    `cargo xtask bench-http`'s).
#
# Durability, stated: Blobpool runs its default store (SQLite kv,
# synchronous=NORMAL in WAL, local large tier, fsync on publish) and
# verifies every byte it serves; nginx's PUT writes a temp file and renames
# it, no fsync; redis keeps everything in memory (no RDB, no AOF here); the
# local ccache writes files without fsync. Every read is from memory or the
# page cache.
#
# Usage: bench/cache/run.sh [--quick] [--http]   (via `cargo xtask bench-cache`)
# Env: BENCH_CACHE_BLOBPOOL=path skips `cargo build --release -p blobpool`;
# BENCH_CACHE_ROUNDS, BENCH_CACHE_UNITS, BENCH_CACHE_CONNS override the sizes.
# Needs: ccache >= 4.4 (http + redis storage), nginx, redis-server, gcc,
# curl, python3 (and wrk for --http): Debian packages.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BENCH=bench-cache
# shellcheck source=bench/cache/lib.sh
. bench/cache/lib.sh
QUICK=0; HTTP=0
for a in "$@"; do
  case $a in
    --quick) QUICK=1 ;;
    --http) HTTP=1 ;;
    *) echo "usage: bench/cache/run.sh [--quick] [--http]" >&2; exit 2 ;;
  esac
done
ROUNDS=${BENCH_CACHE_ROUNDS:-$([ $QUICK = 1 ] && echo 3 || echo 5)}
UNITS=${BENCH_CACHE_UNITS:-$([ $QUICK = 1 ] && echo 60 || echo 150)}
FUNCS=12   # functions per unit: ~10 KiB objects, closer to real ones than 2 KiB
CONNS=${BENCH_CACHE_CONNS:-$([ $QUICK = 1 ] && echo 1000 || echo 3000)}
DUR=$([ $QUICK = 1 ] && echo 3s || echo 8s)
need="ccache nginx redis-server redis-cli gcc curl python3"
[ $HTTP = 1 ] && need="$need wrk"
for t in $need; do
  command -v $t >/dev/null || { echo "bench-cache: $t is not installed (apt-get install ccache nginx redis-server gcc curl wrk)" >&2; exit 1; }
done
ccache --version | grep -q "http-storage.*redis-storage\|redis-storage.*http-storage" ||
  { echo "bench-cache: this ccache has no http and redis storage (needs >= 4.4): $(ccache --version | head -1)" >&2; exit 1; }
blobpool_bin
W=$(mktemp -d /tmp/blobpool-bench-cache.XXXXXX)
cleanup() {
  [ -n "${RD_PID:-}" ] && kill "$RD_PID" 2>/dev/null || true
  stop_servers BENCH_CACHE_KEEP
}
trap cleanup EXIT
run_start

# --- the servers -----------------------------------------------------------
BP_PORT=$(free_port); NG_PORT=$(free_port); RD_PORT=$(free_port)
start_blobpool "$BP_PORT" cc http
mkdir -p "$W/www/files" "$W/www/ccache"
start_nginx "$NG_PORT" 'location /files/ { dav_methods PUT; create_full_put_path on; }' \
  'location /ccache/ { dav_methods PUT DELETE; create_full_put_path on; dav_access user:rw; }'
# A redis of our own: the machine's shared redis on 6379 is left alone.
redis-server --bind 127.0.0.1 --port "$RD_PORT" --save "" --appendonly no \
  --dir "$W" --logfile "$W/redis.log" --daemonize no &
RD_PID=$!
wait_blobpool
for _ in $(seq 1 50); do redis-cli -p "$RD_PORT" ping >/dev/null 2>&1 && break; sleep 0.2; done
redis-cli -p "$RD_PORT" ping >/dev/null || { echo "bench-cache: redis-server did not start" >&2; exit 1; }
rd() { redis-cli -p "$RD_PORT" "$@"; }

minmax() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.3f–%.3f", lo, hi}'; }
# CPU seconds a server's processes have run so far (user + system, every thread).
server_pids() {
  case $1 in
    blobpool) echo "$BP_PID" ;;
    nginx) cat "$W/nginx.pid"; pgrep -P "$(cat "$W/nginx.pid")" ;;
    redis) echo "$RD_PID" ;;
    local) ;;
  esac
}
cpu_s() { # $1: side; on-CPU time of every thread (schedstat, ns), in seconds
  for p in $(server_pids "$1"); do cat /proc/"$p"/task/*/schedstat 2>/dev/null; done |
    awk '{s += $1} END {printf "%.6f", s / 1e9}'
}

# --- 1. ccache ---------------------------------------------------------------
SRC=$W/src; mkdir -p "$SRC"
for i in $(seq 1 $UNITS); do
  {
    echo '#include <stdio.h>'; echo '#include <stdlib.h>'; echo '#include <string.h>'
    echo "static int table$i[256];"
    for f in $(seq 1 $FUNCS); do
      echo "int work${i}_$f(const char *s, int n) { int h = $i * $f; for (size_t k = 0; k < strlen(s); k++) { h = h * 31 + s[k]; table$i[k & 255] += h ^ n; if (h % $((f + 2)) == 0) h += work${i}_$(( f > 1 ? f - 1 : 1 ))(s + 1, n - 1); } return h; }"
      echo "void show${i}_$f(void) { char b[64]; snprintf(b, sizeof b, \"unit $i f $f %d\", rand()); printf(\"%d %s\\n\", work${i}_$f(b, $f), b); }"
    done
  } > "$SRC/u$i.c"
done
build() { # $1: out dir; ccache's configuration comes from the caller's environment
  mkdir -p "$1"
  for f in "$SRC"/*.c; do ccache gcc -O2 -c "$f" -o "$1/$(basename "$f" .c).o"; done
}
stat_of() { CCACHE_DIR=$1 ccache --print-stats | awk -F'\t' -v k="$2" '$1==k{print $2}'; }
export CCACHE_BASEDIR=$W CCACHE_NOHASHDIR=true CCACHE_SLOPPINESS=time_macros
unset CCACHE_REMOTE_STORAGE CCACHE_REMOTE_ONLY CCACHE_SECONDARY_STORAGE CCACHE_PREFIX CCACHE_DISABLE || true
SIDES=(local blobpool nginx redis)
declare -A T CPU URL
# Fill one storage: empty it, then a cold build through it.
fill() { # $1: side, $2: round
  local side=$1 r=$2 dir="$W/cc-$1-$2"
  rm -rf "$dir" "$W/o-cold-$side"
  case $side in
    local) CCACHE_DIR=$dir build "$W/o-cold-$side"; return ;;
    blobpool) URL[$side]="http://127.0.0.1:$BP_PORT/cache/cc/r$r" ;;  # a fresh prefix: empty
    nginx) rm -rf "$W/www/ccache/"*; URL[$side]="http://127.0.0.1:$NG_PORT/ccache/r$r" ;;
    redis) rd FLUSHDB >/dev/null; URL[$side]="redis://127.0.0.1:$RD_PORT" ;;
  esac
  CCACHE_DIR=$dir-cold CCACHE_REMOTE_STORAGE=${URL[$side]} CCACHE_REMOTE_ONLY=true build "$W/o-cold-$side"
  [ "$(stat_of "$dir-cold" remote_storage_write)" -ge "$UNITS" ] ||
    { echo "bench-cache: $side round $r: the cold build stored $(stat_of "$dir-cold" remote_storage_write) entries for $UNITS units" >&2; exit 1; }
  rm -rf "$dir-cold"
}
# One compile of the all-hits rebuild through one storage; adds its wall time.
hit() { # $1: side, $2: round, $3: source
  local side=$1 dir="$W/cc-$1-$2" o t0
  o="$W/o-warm-$side/$(basename "$3" .c).o"
  t0=$EPOCHREALTIME
  if [ $side = local ]; then
    CCACHE_DIR=$dir ccache gcc -O2 -c "$3" -o "$o"
  else
    CCACHE_DIR=$dir CCACHE_REMOTE_STORAGE=${URL[$side]} CCACHE_REMOTE_ONLY=true ccache gcc -O2 -c "$3" -o "$o"
  fi
  T[$side,$2]=$(awk -v s="${T[$side,$2]:-0}" -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.6f", s + b - a}')
}
# ccache's own statistics: every compile a direct hit from this storage.
check() { # $1: side, $2: round
  local side=$1 r=$2 dir="$W/cc-$1-$2" dh miss hit err to
  dh=$(stat_of "$dir" direct_cache_hit); miss=$(stat_of "$dir" cache_miss)
  err=$(stat_of "$dir" remote_storage_error); to=$(stat_of "$dir" remote_storage_timeout)
  hit=$(stat_of "$dir" $([ $side = local ] && echo local_storage_hit || echo remote_storage_hit))
  if [ "$dh" != "$UNITS" ] || [ "$hit" != "$UNITS" ] || [ "$miss" != 0 ] || [ "$err" != 0 ] || [ "$to" != 0 ]; then
    echo "bench-cache: $side round $r is not all hits: direct hits $dh, storage hits $hit, misses $miss, remote errors $err, timeouts $to (of $UNITS)" >&2
    exit 1
  fi
  [ $side = local ] || [ "$(stat_of "$dir" local_storage_hit)" = 0 ] ||
    { echo "bench-cache: $side round $r: local hits with remote_only" >&2; exit 1; }
  for f in "$W/o-cold-$side"/*.o; do
    cmp -s "$f" "$W/o-warm-$side/$(basename "$f")" || { echo "bench-cache: $side round $r: $(basename "$f") differs from the cold build's" >&2; exit 1; }
  done
  rm -rf "$dir" "$W/o-cold-$side" "$W/o-warm-$side"
}
OBJ_KIB=$(gcc -O2 -c "$SRC/u1.c" -o "$W/probe.o"; echo $(( $(stat -c %s "$W/probe.o") / 1024 )))
echo "bench-cache: ccache $(ccache --version | head -1 | awk '{print $3}'), $UNITS units (~$OBJ_KIB KiB objects), $ROUNDS rounds, sides ${SIDES[*]}" >&2
# Each server's CPU while idle (redis's cron ticks 10 times a second), subtracted
# from its CPU during a rebuild so the per-compile figure is the requests' own.
declare -A IDLE
for s in blobpool nginx redis; do IDLE[$s]=$(cpu_s $s); done
sleep 3
for s in blobpool nginx redis; do IDLE[$s]=$(awk -v a="${IDLE[$s]}" -v b="$(cpu_s $s)" 'BEGIN {printf "%.6f", (b - a) / 3}'); done
IDLE[local]=0
for r in $(seq 1 $ROUNDS); do
  # Fill every storage first, then rebuild through all four at once: compile
  # by compile, the order rotating each compile, so a load spike from the
  # machine's other users falls on all four sides alike.
  for s in "${SIDES[@]}"; do fill "$s" "$r"; done
  sync
  for s in "${SIDES[@]}"; do
    T[$s,$r]=0; mkdir -p "$W/cc-$s-$r" "$W/o-warm-$s"; CCACHE_DIR=$W/cc-$s-$r ccache -z >/dev/null
    CPU[$s,$r]=$(cpu_s $s)
  done
  R0=$EPOCHREALTIME
  i=0
  for f in "$SRC"/*.c; do
    for k in 0 1 2 3; do hit "${SIDES[$(( (k + i) % 4 ))]}" "$r" "$f"; done
    i=$((i + 1))
  done
  for s in "${SIDES[@]}"; do
    CPU[$s,$r]=$(awk -v a="${CPU[$s,$r]}" -v b="$(cpu_s $s)" -v i="${IDLE[$s]}" -v d="$(awk -v a="$R0" -v b="$EPOCHREALTIME" 'BEGIN {print b - a}')" 'BEGIN {printf "%.6f", b - a - i * d}')
    check "$s" "$r"
  done
  echo "bench-cache: round $r: local ${T[local,$r]} s, blobpool ${T[blobpool,$r]} s, nginx ${T[nginx,$r]} s, redis ${T[redis,$r]} s" >&2
done

echo
echo "**ccache all-hits rebuild** — $UNITS units (~$OBJ_KIB KiB objects), serial \`ccache gcc -O2 -c\`, $ROUNDS rounds. Rebuild time = the sum of the $UNITS compiles' wall times; the four storages' rebuilds run interleaved compile by compile (order rotating), so each ratio to the local directory is taken *within one round* under the same load. Server CPU = the server's on-CPU time (every thread, /proc schedstat) during the round's rebuild less its idle rate, per compile (two GETs: manifest, result):"
echo
echo "| storage | rebuild s, per round | median s | ÷ local, per round | server CPU µs per compile (median) | target | verdict |"
echo "|---|---|---|---|---|---|---|"
for s in "${SIDES[@]}"; do
  ts=(); rs=(); cs=()
  for r in $(seq 1 $ROUNDS); do
    ts+=("$(printf '%.3f' "${T[$s,$r]}")"); rs+=("$(div "${T[$s,$r]}" "${T[local,$r]}")")
    cs+=("$(awk -v c="${CPU[$s,$r]}" -v n="$UNITS" 'BEGIN {printf "%.0f", c * 1e6 / n}')")
  done
  med=$(printf '%s\n' "${ts[@]}" | median)
  cpu=$([ $s = local ] && echo "—" || printf '%s\n' "${cs[@]}" | median | awk '{printf "%.0f", $1}')
  case $s in
    local) name="local directory"; tgt="—"; v="(reference)" ;;
    blobpool) name="Blobpool \`/cache/cc\` (http)"; tgt="≤ 1.2× local"; v=$(verdict 1.2 "${rs[@]}") ;;
    nginx) name="nginx WebDAV (http)"; tgt="—"; v="(peer)" ;;
    redis) name="redis (own instance, no persistence)"; tgt="—"; v="(peer)" ;;
  esac
  echo "| $name | ${ts[*]} | $med | ${rs[*]} | $cpu | $tgt | $v |"
done
bn=()
for r in $(seq 1 $ROUNDS); do bn+=("$(div "${T[blobpool,$r]}" "${T[nginx,$r]}")"); done
br=()
for r in $(seq 1 $ROUNDS); do br+=("$(div "${T[blobpool,$r]}" "${T[redis,$r]}")"); done
echo "| Blobpool ÷ nginx WebDAV | | | ${bn[*]} | | ≤ 1.0× | $(verdict 1.0 "${bn[@]}") |"
echo "| Blobpool ÷ redis | | | ${br[*]} | | — | (median $(printf '%s\n' "${br[@]}" | median)×) |"

# --- 2. A GET on a fresh connection ---------------------------------------------
gcc -O2 -o "$W/fresh_get" "$ROOT/bench/cache/fresh_get.c"
head -c 8192 /dev/urandom > "$W/body-fresh"
curl -fsS -o /dev/null -X PUT --data-binary @"$W/body-fresh" "http://127.0.0.1:$BP_PORT/cache/cc/fresh/obj"
mkdir -p "$W/www/ccache/fresh"; cp "$W/body-fresh" "$W/www/ccache/fresh/obj"
rd -x SET fresh:obj < "$W/body-fresh" >/dev/null
for url in "http://127.0.0.1:$BP_PORT/cache/cc/fresh/obj" "http://127.0.0.1:$NG_PORT/ccache/fresh/obj"; do
  curl -fsS "$url" | cmp -s - "$W/body-fresh" || { echo "bench-cache: $url does not answer the body" >&2; exit 1; }
done
rd --raw GET fresh:obj | head -c 8192 | cmp -s - "$W/body-fresh" || { echo "bench-cache: redis does not answer the body" >&2; exit 1; }
fresh() { # $1 side, $2 gets per connection -> "median p90 p99 mean bytes"
  case $1 in
    blobpool) "$W/fresh_get" http 127.0.0.1 "$BP_PORT" /cache/cc/fresh/obj "$CONNS" "$2" ;;
    nginx) "$W/fresh_get" http 127.0.0.1 "$NG_PORT" /ccache/fresh/obj "$CONNS" "$2" ;;
    redis) "$W/fresh_get" redis 127.0.0.1 "$RD_PORT" fresh:obj "$CONNS" "$2" ;;
  esac
}
declare -A F FCPU
FS=(blobpool nginx redis)
for r in $(seq 1 $ROUNDS); do
  for k in 0 1 2; do
    s=${FS[$(( (k + r - 1) % 3 ))]}
    for g in 1 2; do
      c0=$(cpu_s "$s"); F[$s,$g,$r]=$(fresh "$s" $g); c1=$(cpu_s "$s")
      FCPU[$s,$g,$r]=$(awk -v a="$c0" -v b="$c1" -v n="$CONNS" 'BEGIN {printf "%.0f", (b - a) * 1e6 / n}')
    done
  done
done
echo
echo "**A GET on a fresh connection** (8 KiB body; \`bench/cache/fresh_get.c\`: connect, GET, read, close; $CONNS connections per side and round, $ROUNDS interleaved rounds; client and server share the 2 cores). Connect-to-close µs, median of the rounds' medians (the rounds' medians in parentheses), p99 the worst round's; server CPU µs per connection:"
echo
echo "| server | 1 GET per connection: median µs | p99 µs | server CPU µs | 2 GETs per connection (ccache's hit): median µs | p99 µs | server CPU µs |"
echo "|---|---|---|---|---|---|---|"
for s in "${FS[@]}"; do
  row="| $(case $s in blobpool) echo "Blobpool \`/cache/cc\`" ;; nginx) echo "nginx (open_file_cache)" ;; redis) echo "redis GET" ;; esac)"
  for g in 1 2; do
    meds=(); p99s=(); cpus=()
    for r in $(seq 1 $ROUNDS); do
      read -r m _ p _ _ <<<"${F[$s,$g,$r]}"; meds+=("$m"); p99s+=("$p"); cpus+=("${FCPU[$s,$g,$r]}")
    done
    row="$row | $(printf '%s\n' "${meds[@]}" | median | awk '{printf "%.0f", $1}') ($(printf '%.0f ' "${meds[@]}" | sed 's/ $//')) | $(printf '%s\n' "${p99s[@]}" | maxof | awk '{printf "%.0f", $1}') | $(printf '%s\n' "${cpus[@]}" | median | awk '{printf "%.0f", $1}')"
  done
  echo "$row |"
done

# --- 3. HTTP GET / PUT against nginx (only with --http) ------------------------
if [ $HTTP = 1 ]; then
  echo
  echo "| row | peer | Blobpool | ratio |"
  echo "|---|---|---|---|"
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
      B=(); N=(); R=()
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
        B+=("$b"); N+=("$n"); R+=("$(div "$n" "$b")")
      done
      bm=$(printf '%s\n' "${B[@]}" | median); nm=$(printf '%s\n' "${N[@]}" | median)
      # nginx ÷ Blobpool per round, so the at-most rule reads "Blobpool ≥ 0.7× nginx" as ≤ 1/0.7.
      echo "| HTTP $op $label, wrk -t2 -c16 (unpinned) | nginx $nm req/s ($(printf '%s\n' "${N[@]}" | minmax)) | Blobpool $bm req/s ($(printf '%s\n' "${B[@]}" | minmax)) | $(div "$bm" "$nm")× nginx at the medians; target ≥ 0.7×: $(verdict 1.4286 "${R[@]}" | sed 's/×/× (nginx ÷ Blobpool)/g') |"
    done
  done
fi

echo
run_footer
