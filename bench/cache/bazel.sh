#!/usr/bin/env bash
# The Bazel benchmark (issue 42, "Performance"; ADR-072): Bazel 2.1.0's
# all-remote-hits rebuild through Blobpool over HTTP and over gRPC against
# the same rebuild from Bazel's local --disk_cache, with nginx WebDAV (an
# HTTP cache many sites run) as a peer. Target: Blobpool within 1.2× the
# disk cache's wall time.
#
# A workspace of genrules (TARGETS small text outputs of ~3-50 KiB, four
# of ~2 MiB, one bundle over them all). Each side has its own Bazel server
# and output base, kept warm: a cold build fills its storage, one untimed
# rebuild warms the server, then per round `bazel clean` and the timed
# `bazel build` (the client's wall time). Every timed build's summary must
# read "N processes: N remote cache hit." (a disk-cache hit is reported so
# too), or the run fails. Rounds are interleaved, the order rotating; the
# verdict uses the worst-round rule (ADR-051): met only when every round's
# ratio clears the target, "not proven" when only the median does.
#
# Blobpool runs its default store (SQLite kv, local large tier, fsync on
# publish) and verifies every byte it serves, with SHA-256 names as Bazel
# sends them (no digest flag); nginx writes files without fsync and
# verifies nothing; the disk cache is Bazel's own files.
#
# Usage: bench/cache/bazel.sh [--quick]   (via `cargo xtask bench-bazel`)
# Env: BENCH_CACHE_BLOBPOOL=path skips `cargo build --release -p blobpool`;
# BLOBPOOL_TEST_BAZEL is the Bazel binary (default: .ci/run's npm install);
# BENCH_BAZEL_ROUNDS, BENCH_BAZEL_TARGETS override the sizes, BENCH_BAZEL_SIDES
# the sides (default "disk http grpc nginx"; disk first).
# Needs: Bazel 2.1.0 (npm @bazel/bazel-linux_x64), nginx, curl, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
BENCH=bench-bazel
# shellcheck source=bench/cache/lib.sh
. bench/cache/lib.sh
QUICK=0
for a in "$@"; do
  case $a in
    --quick) QUICK=1 ;;
    *) echo "usage: bench/cache/bazel.sh [--quick]" >&2; exit 2 ;;
  esac
done
ROUNDS=${BENCH_BAZEL_ROUNDS:-$([ $QUICK = 1 ] && echo 3 || echo 7)}
TARGETS=${BENCH_BAZEL_TARGETS:-$([ $QUICK = 1 ] && echo 100 || echo 300)}
BAZEL=${BLOBPOOL_TEST_BAZEL:-/opt/bazel-npm/node_modules/.bin/bazel}
[ -x "$BAZEL" ] || { echo "bench-bazel: no Bazel at $BAZEL (npm install --prefix /opt/bazel-npm @bazel/bazel-linux_x64@2.1.0; .ci/run does it)" >&2; exit 1; }
for t in nginx curl python3; do
  command -v $t >/dev/null || { echo "bench-bazel: $t is not installed (apt-get install nginx curl python3)" >&2; exit 1; }
done
blobpool_bin
W=$(mktemp -d /tmp/blobpool-bench-bazel.XXXXXX)
read -r -a SIDES <<<"${BENCH_BAZEL_SIDES:-disk http grpc nginx}"
[ "${SIDES[0]}" = disk ] || { echo "bench-bazel: the first side must be disk (the reference)" >&2; exit 1; }
bz() { # $1: side; the rest: Bazel's command and options
  local side=$1; shift
  (cd "$W/ws" && "$BAZEL" --nohome_rc --nosystem_rc --noworkspace_rc \
    --install_base="$W/install" --output_user_root="$W/root" \
    --output_base="$W/base-$side" --max_idle_secs=600 "$@")
}
cleanup() {
  for s in "${SIDES[@]}"; do [ -d "$W/base-$s" ] && bz "$s" shutdown >/dev/null 2>&1 || true; done
  stop_servers BENCH_BAZEL_KEEP
}
trap cleanup EXIT
run_start

# --- the servers ---------------------------------------------------------------
BP_PORT=$(free_port); NG_PORT=$(free_port)
start_blobpool "$BP_PORT" bazel
mkdir -p "$W/www/bazel"
start_nginx "$NG_PORT" 'location /bazel/ { dav_methods PUT DELETE; create_full_put_path on; dav_access user:rw; }'
wait_blobpool

flags() { # $1: side -> its cache flags
  case $1 in
    disk) echo "--disk_cache=$W/disk" ;;
    http) echo "--remote_cache=http://127.0.0.1:$BP_PORT/cache/bazel" ;;
    grpc) echo "--remote_cache=grpc://127.0.0.1:$BP_PORT --remote_instance_name=bazel" ;;
    nginx) echo "--remote_cache=http://127.0.0.1:$NG_PORT/bazel" ;;
  esac
}

# --- the workspace -----------------------------------------------------------------
mkdir -p "$W/ws"
echo 'workspace(name = "bench_genrules")' > "$W/ws/WORKSPACE"
printf 'alpha\nbeta\ngamma\n' > "$W/ws/input.txt"
cat > "$W/ws/BUILD" <<BUILD
[genrule(
    name = "part%d" % i,
    srcs = ["input.txt"],
    outs = ["part%d.txt" % i],
    cmd = "sed 's/^/%d: /' \$< > \$@ && seq 1 %d >> \$@" % (i, 500 * (i % 20 + 1)),
) for i in range($TARGETS)]

[genrule(
    name = "big%d" % i,
    outs = ["big%d.txt" % i],
    cmd = "seq %d %d > \$@" % (i, 300000 + i),
) for i in range(4)]

genrule(
    name = "bundle",
    srcs = [":part%d" % i for i in range($TARGETS)] + [":big%d" % i for i in range(4)],
    outs = ["bundle.txt"],
    cmd = "cat \$(SRCS) | cksum > \$@",
)
BUILD
SPAWNS=$((TARGETS + 5))

build() { # $1: side, $2: what for; prints the wall seconds; fails unless the summary is $3 (if given)
  local side=$1 what=$2 want=${3:-} t0 t1 out
  t0=$EPOCHREALTIME
  # shellcheck disable=SC2046
  out=$(bz "$side" build --spawn_strategy=local --color=no --curses=no --noshow_progress \
    $(flags "$side") //:bundle 2>&1) || { echo "bench-bazel: $side $what failed:" >&2; echo "$out" >&2; exit 1; }
  t1=$EPOCHREALTIME
  if [ -n "$want" ] && ! grep -qx "INFO: $want" <<<"$out"; then
    echo "bench-bazel: $side $what is not \"$want\":" >&2; echo "$out" >&2; exit 1
  fi
  if grep -q "WARNING: .*[Rr]emote [Cc]ache" <<<"$out"; then
    echo "bench-bazel: $side $what warned about the remote cache:" >&2; echo "$out" >&2; exit 1
  fi
  # The same bundle as the disk side's cold build.
  [ ! -f "$W/bundle-ref" ] || cmp -s "$W/bundle-ref" "$W/base-$side/execroot/bench_genrules/bazel-out/k8-fastbuild/bin/bundle.txt" ||
    { echo "bench-bazel: $side $what built another bundle" >&2; exit 1; }
  awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f", b - a}'
}
HITS="$SPAWNS processes: $SPAWNS remote cache hit."
echo "bench-bazel: Bazel $("$BAZEL" --version 2>/dev/null | awk '{print $2}'), $SPAWNS genrules, $ROUNDS rounds, sides ${SIDES[*]}" >&2
for s in "${SIDES[@]}"; do
  build "$s" "cold build" >/dev/null
  [ -f "$W/bundle-ref" ] || cp "$W/base-$s/execroot/bench_genrules/bazel-out/k8-fastbuild/bin/bundle.txt" "$W/bundle-ref"
  bz "$s" clean >/dev/null 2>&1
  build "$s" "warm-up rebuild" "$HITS" >/dev/null
done
declare -A T
for r in $(seq 1 "$ROUNDS"); do
  line=""
  for k in $(seq 0 $(( ${#SIDES[@]} - 1 ))); do
    s=${SIDES[$(( (k + r - 1) % ${#SIDES[@]} ))]}
    bz "$s" clean >/dev/null 2>&1
    T[$s,$r]=$(build "$s" "round $r" "$HITS")
    line="$line $s ${T[$s,$r]} s"
  done
  echo "bench-bazel: round $r:$line" >&2
done

OUT_KIB=$(du -sk "$W/base-disk/execroot/bench_genrules/bazel-out/k8-fastbuild/bin" | awk '{print $1}')
echo
echo "**Bazel all-remote-hits rebuild** — Bazel 2.1.0, $SPAWNS genrules (~$((OUT_KIB / 1024)) MiB of outputs), \`bazel clean\` then \`bazel build\` on a warm server, $ROUNDS interleaved rounds (order rotating); wall time of the client command; every rebuild \"$HITS\":"
echo
echo "| cache | rebuild s, per round | median s | ÷ disk cache, per round | target | verdict |"
echo "|---|---|---|---|---|---|"
for s in "${SIDES[@]}"; do
  ts=(); rs=()
  for r in $(seq 1 "$ROUNDS"); do
    ts+=("$(printf '%.3f' "${T[$s,$r]}")"); rs+=("$(div "${T[$s,$r]}" "${T[disk,$r]}")")
  done
  case $s in
    disk) name="Bazel \`--disk_cache\` (local)"; tgt="—"; v="(reference)" ;;
    http) name="Blobpool HTTP \`/cache/bazel\` (SHA-256)"; tgt="≤ 1.2× disk"; v=$(verdict 1.2 "${rs[@]}") ;;
    grpc) name="Blobpool gRPC (REAPI, SHA-256)"; tgt="≤ 1.2× disk"; v=$(verdict 1.2 "${rs[@]}") ;;
    nginx) name="nginx WebDAV (http)"; tgt="—"; v="(peer)" ;;
  esac
  echo "| $name | ${ts[*]} | $(printf '%s\n' "${ts[@]}" | median) | ${rs[*]} | $tgt | $v |"
done
echo
run_footer
