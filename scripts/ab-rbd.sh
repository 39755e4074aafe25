#!/usr/bin/env bash
# A/B benchmark (not a test): two builds of Reservoir's target (or one build with two LUN
# settings) over the same RBD image, in alternating pairs, beside fio's rbd engine (librbd
# directly, the ceiling) in each pair. The cluster is scripts/ceph-cluster.sh's (one
# monitor, one OSD on memstore), started here and stopped at the end.
#
#   RSV_A=path/to/rsv RSV_B=path/to/rsv scripts/ab-rbd.sh [PAIRS] [SECONDS]
#
# PAIRS alternating pairs (default 3; A first in odd pairs, B first in even ones), SECONDS
# per measurement (default 6). ROWS picks the workloads, default "r4 w4 r1 w1": 4 KiB random
# reads (iscsi-perf), 4 KiB random writes (`rsv bench`), 1 MiB sequential reads, 1 MiB
# sequential writes, all at queue depth 32, each on both targets and fio's rbd engine.
# PARAMS_A / PARAMS_B are appended to each target's store (`&threads=2`, say), so that one
# build can be compared with itself. Each target exports `rbd:rbd/bench?cache=no...`.
# Prints one line per measurement and a summary per row: IOPS and MB/s (mean of the pairs),
# the ratio to fio's, and CPU seconds per GiB moved of the target, of the initiator, of both,
# and of fio's whole process (librbd inside it); the load average at the start and end.
# With FIO1=1, fio also runs with `librados thread count = 1` (row "fio1").
# With PROFILE=ROW (r4, w4, r1 or w1), instead: one run of that row on target B and one of
# fio under `perf record -g`, and the top of each profile by thread and by shared object,
# then by symbol (perf.data files kept in $PROFILE_DIR, default /dev/shm/rbd6-prof); with
# PROFILE_ALL=1 both profiles are of the whole machine.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
PAIRS=${1:-3}
SECS=${2:-6}
ROWS=${ROWS:-r4 w4 r1 w1}
SIZE_MB=${SIZE_MB:-512}
: "${RSV_A:?RSV_A=path to the first rsv}" "${RSV_B:?RSV_B=path to the second rsv}"

rbd_work rsv-ab-rbd
load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)
rbd_bench_image "$work" "$SIZE_MB"
osd_pid=$(cat "$work/ceph/run/osd.0.pid")
# With FIO1=1, fio runs a second time in each pair with one librados completion thread
# (side "fio1"), as the target's store has by default.
sed 's/^\[client\]$/[client]\nlibrados thread count = 1/' "$CEPH_CONF" >"$work/fio1.conf"
TCK=$(getconf CLK_TCK)

start_target() { # name rsv params -> sets url_NAME and pid_NAME
  target_toml iqn.2026-11.org.reservoir:ab-rbd "store = \"rbd:rbd/bench?conf=$CEPH_CONF&cache=no$3\"" \
    >"$work/$1.toml"
  start_ready "$work/$1.out" "$work/$1.log" \
    "$2" target --listen 127.0.0.1:0 --data-dir "$work/data-$1" --config "$work/$1.toml" || true
  pids+=("$STARTED_PID")
  eval "pid_$1=$STARTED_PID"
  eval "url_$1=iscsi://$(portals_of "$work/$1.out" | head -1)/iqn.2026-11.org.reservoir:ab-rbd/0"
}
start_target A "$RSV_A" "${PARAMS_A:-}"
start_target B "$RSV_B" "${PARAMS_B:-}"

rsvw() { # bs rand|seq url -> "IOPS MBs BYTES"
  timeout $((SECS + 30)) "$RSV_B" bench --rw write --pattern "$2" --block-size "$1" \
    --queue-depth 32 --duration "$SECS" --json "$3" 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(int(r["iops"]), int(r["MB_per_s"]), r["ios"] * r["block_size"])'
}
# The client command of a row through a target (url) or, with url "fio", fio's.
client() { # row url
  case "$1:$2" in
    r4:fio) fio_rbd 4k randread ;; w4:fio) fio_rbd 4k randwrite ;;
    r1:fio) fio_rbd 1m read ;; w1:fio) fio_rbd 1m write ;;
    r4:*) iperf 8 rand "$2" ;; w4:*) rsvw 4k rand "$2" ;;
    r1:*) iperf 2048 seq "$2" ;; w1:*) rsvw 1M seq "$2" ;;
  esac
}
rewrite() {
  fio --name=rw --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench --rw=write \
    --bs=4m --iodepth=8 --direct=1 --size="${SIZE_MB}M" >/dev/null 2>&1
}
export -f iperf rsvw fio_rbd client
export SECS RSV_B CEPH_CONF

# One measurement: "IOPS MBs BYTES CLIENT_CPU TARGET_CPU OSD_CPU".
measure() { # row side(A|B|fio)
  local url tpid t0 t1 o0 o1 line
  local conf=$CEPH_CONF
  case $2 in A) url=$url_A tpid=$pid_A ;; B) url=$url_B tpid=$pid_B ;; fio) url=fio tpid= ;;
    fio1) url=fio tpid= conf=$work/fio1.conf ;; esac
  t0=$([ -n "$tpid" ] && cpu_of "$tpid" || echo 0)
  o0=$(cpu_of "$osd_pid")
  line=$(CEPH_CONF=$conf /usr/bin/time -f '%U %S' -o "$work/cpu" bash -c 'client "$0" "$1"' "$1" "$url")
  t1=$([ -n "$tpid" ] && cpu_of "$tpid" || echo 0)
  o1=$(cpu_of "$osd_pid")
  echo "${line:-0 0 0} $(awk '{ printf "%.3f", $1 + $2 }' "$work/cpu") $(python3 -c "print(f'{$t1-$t0:.3f} {$o1-$o0:.3f}')")"
}

if [ -n "${PROFILE:-}" ]; then
  dir=${PROFILE_DIR:-/dev/shm/rbd6-prof}
  mkdir -p "$dir"
  # PROFILE_ALL=1: the whole machine (target, initiator, OSD, anything else), not target B.
  who=(-p "$pid_B")
  [ "${PROFILE_ALL:-0}" = 1 ] && who=(-a)
  perf record -g -o "$dir/target.data" "${who[@]}" -- sleep "$SECS" >/dev/null 2>&1 &
  prec=$!
  echo "target B: $(measure "$PROFILE" B)"
  wait "$prec" || true
  all=()
  [ "${PROFILE_ALL:-0}" = 1 ] && all=(-a)
  perf record -g "${all[@]}" -o "$dir/fio.data" -- bash -c 'client "$0" fio' "$PROFILE" >"$work/fio.out" 2>/dev/null
  echo "fio: $(cat "$work/fio.out")"
  for w in target fio; do
    echo "== $w: by thread, shared object (self)"
    perf report -i "$dir/$w.data" --no-children --sort comm,dso --stdio 2>/dev/null |
      grep -v '^#' | grep -v '^$' | grep '%' | head -25
    echo "== $w: by symbol (self)"
    perf report -i "$dir/$w.data" --no-children --sort comm,sym --stdio -g none 2>/dev/null |
      grep -v '^#' | grep -v '^$' | grep '%' | head -45
  done
  echo "load average: start $load_start, end $(load)"
  exit 0
fi

echo "# row side IOPS MBs bytes client_cpu target_cpu osd_cpu   (load at start $load_start)"
for p in $(seq "$PAIRS"); do
  order="A B"
  [ $((p % 2)) = 0 ] && order="B A"
  for r in $ROWS; do
    sides="$order fio"
    [ "${FIO1:-0}" = 1 ] && sides="$sides fio1"
    for s in $sides; do
      # Memstore keeps an object as one buffer list that 4 KiB overwrites cut into pieces:
      # each 4 KiB write run leaves the OSD slower for the next (in the first sittings the
      # first of each pair was the faster, whichever build it was). Every 4 KiB write run
      # starts from an image rewritten whole in 4 MiB writes (not measured).
      [ "$r" = w4 ] && [ "${REWRITE:-1}" = 1 ] && rewrite
      echo "$r $s $(measure "$r" "$s")" | tee -a "$work/results"
    done
  done
done
load_end=$(load)
echo "# summary: mean of $PAIRS pairs; CPU s/GiB target / initiator / both, fio's whole process"
python3 - "$work/results" <<'PY'
import sys, collections
rows = collections.defaultdict(list)
for l in open(sys.argv[1]):
    r, s, *v = l.split()
    rows[(r, s)].append([float(x) for x in v])
names = {"r4": "4 KiB random read", "w4": "4 KiB random write", "r1": "1 MiB seq read", "w1": "1 MiB seq write"}
for r in ["r4", "w4", "r1", "w1"]:
    if (r, "fio") not in rows:
        continue
    f = rows[(r, "fio")]
    fi = sum(x[0] for x in f) / len(f); fm = sum(x[1] for x in f) / len(f)
    fb = sum(x[2] for x in f) / 2**30; fc = sum(x[3] for x in f)
    big = r.endswith("1")
    print(f"{names[r]}: fio {fi:,.0f} IOPS {fm:,.0f} MB/s, {fc/fb:.2f} CPU s/GiB (whole process)")
    for s in ["A", "B", "fio1"]:
        if (r, s) not in rows:
            continue
        v = rows[(r, s)]
        i = sum(x[0] for x in v) / len(v); m = sum(x[1] for x in v) / len(v)
        b = sum(x[2] for x in v) / 2**30
        t = sum(x[4] for x in v) / b; c = sum(x[3] for x in v) / b
        ratio = (m / fm) if big else (i / fi)
        each = " / ".join(f"{x[1] if big else x[0]:.0f}" for x in v)
        tg = " / ".join(f"{x[4] / (x[2] / 2**30):.2f}" for x in v)
        print(f"  {s}: {i:,.0f} IOPS {m:,.0f} MB/s = {ratio:.2f}x fio; target {t:.2f}, initiator {c:.2f}, both {t+c:.2f} CPU s/GiB  (each: {each}; target s/GiB {tg})")
PY
echo "load average: start $load_start, end $load_end; $(nproc) CPUs; image $SIZE_MB MiB, memstore"
