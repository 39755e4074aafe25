#!/usr/bin/env bash
# Benchmark (not a test): Reservoir's target over an RBD image, read by libiscsi's
# iscsi-perf, beside librbd's own speed on the same image in the same run: fio's rbd engine
# and qemu-img bench over qemu's rbd driver (and, for a like-for-like pair, qemu-img bench
# through the target). The cluster is scripts/ceph-cluster.sh's (one monitor, one OSD on
# memstore) started here and stopped at the end.
#
#   scripts/bench-rbd.sh [SECONDS]      (default 10 s per measurement)
#
# The target exports the image twice: LUN 0 with librbd's cache at its default (on), LUN 1
# with `cache=no`, so that both are measured in the same run. With RSV_BASE=path to
# another build of rsv (main's, say), a second target from it is measured in the same run
# too (rows marked "base"), for a before/after pair under the same load.
# Reads at queue depth 32: 4 KiB random and 1 MiB (sequential for iscsi-perf's and
# qemu-img's, which have no random large reads; random and sequential for fio). Writes at
# queue depth 32, 4 KiB random and 1 MiB sequential: fio's rbd engine beside Reservoir's
# own initiator (`rsv bench --rw write`; iscsi-perf only reads) through the target. Prints a
# table with each Reservoir figure over librbd's (fio), the load average at the start and
# end (the machine may be shared), and writes $OUT (default lab/bench/rbd.json). Every row
# also gives CPU seconds per GiB moved: the client's (fio with librbd in it, iscsi-perf,
# qemu-img: its user + system time), the target's and the OSD's (from /proc, over the
# client's run); on two shared CPUs these say more than throughput ratios do. With
# PERF_STAT=1, the 4 KiB rows also count context switches per read (perf stat) of the
# client and of the target. With THREADS=1, the target's CPU per GiB is also split by
# thread (librbd's io_context_pool, the messenger's msgr-worker-N, tokio's workers, ...).
# Environment: RSV=path to a built rsv (else `cargo build --release` here).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECS=${1:-10}
OUT=${OUT:-lab/bench/rbd.json}
SIZE_MB=${SIZE_MB:-1024}
./scripts/setup.sh
if ! command -v fio >/dev/null || ! fio --enghelp 2>/dev/null | grep -qw rbd; then
  echo "bench-rbd: installing fio" >&2
  apt-get install -y -qq --no-install-recommends fio >/dev/null
fi
build_rsv --features rbd

rbd_work rsv-bench-rbd
target_pid=
base_pid=

load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)
rbd_bench_image "$work" "$SIZE_MB"

target_toml iqn.2026-11.org.reservoir:bench-rbd "store = \"rbd:rbd/bench?conf=$CEPH_CONF\"" \
  '[[target.lun]]' 'id = 1' "store = \"rbd:rbd/bench?conf=$CEPH_CONF&cache=no\"" >"$work/target.toml"
start_ready "$work/target.out" "$work/target.log" \
  "$RSV" target --listen 127.0.0.1:0 --data-dir "$work/data" --config "$work/target.toml" || true
target_pid=$STARTED_PID
pids+=("$target_pid")
portal=$(portals_of "$work/target.out" | head -1)
URL="iscsi://$portal/iqn.2026-11.org.reservoir:bench-rbd/0"
URL_NOCACHE="iscsi://$portal/iqn.2026-11.org.reservoir:bench-rbd/1"
RBD_URL="rbd:rbd/bench:conf=$CEPH_CONF"
if [ -n "${RSV_BASE:-}" ]; then
  start_ready "$work/base.out" "$work/base.log" "$RSV_BASE" target --listen 127.0.0.1:0 \
    --data-dir "$work/data-base" --config "$work/target.toml" || true
  base_pid=$STARTED_PID
  pids+=("$base_pid")
  base_portal=$(portals_of "$work/base.out" | head -1)
  URL_BASE="iscsi://$base_portal/iqn.2026-11.org.reservoir:bench-rbd/0"
fi
osd_pid=$(cat "$work/ceph/run/osd.0.pid")
TCK=$(getconf CLK_TCK)

# CPU seconds of each of a process's threads so far, summed by thread name with its
# number dropped (msgr-worker-0..2 -> msgr-worker), as JSON.
threads_of() {
  python3 - "$1" <<'PY'
import json, os, re, sys
pid, tck, out = sys.argv[1], os.sysconf('SC_CLK_TCK'), {}
for t in os.listdir(f'/proc/{pid}/task'):
    try:
        s = open(f'/proc/{pid}/task/{t}/stat').read()
    except OSError:
        continue
    comm, f = s[s.index('(') + 1:s.rindex(')')], s[s.rindex(')') + 2:].split()
    g = re.sub(r'[-_ ]?\d+$', '', comm)
    out[g] = out.get(g, 0) + (int(f[11]) + int(f[12])) / tck
print(json.dumps(out))
PY
}
# Runs a client ("$@") and appends to its output line "CLIENT TARGET OSD": CPU seconds of
# the client, of target process $TPID (none: 0) and of the OSD over the run. With
# PERF_STAT=1 and CS set, also the context switches of the client and of the target.
measured() {
  local t0 o0 t1 o1 line cpu cs_c=0 cs_t=0 pstat=
  t0=$([ -n "${TPID:-}" ] && cpu_of "$TPID" || echo 0)
  o0=$(cpu_of "$osd_pid")
  [ "${THREADS:-0}" = 1 ] && [ -n "${TPID:-}" ] && threads_of "$TPID" >"$work/threads.0"
  if [ "${PERF_STAT:-0}" = 1 ] && [ -n "${CS:-}" ] && [ -n "${TPID:-}" ]; then
    perf stat -e context-switches -x, -o "$work/cs-target" -p "$TPID" -- sleep "$SECS" &
    pstat=$!
  fi
  if [ "${PERF_STAT:-0}" = 1 ] && [ -n "${CS:-}" ]; then
    line=$(/usr/bin/time -f '%U %S' -o "$work/cpu" \
      perf stat -e context-switches -x, -o "$work/cs-client" -- "$@")
    cs_c=$(awk -F, '/context-switches/ { print $1 }' "$work/cs-client")
  else
    line=$(/usr/bin/time -f '%U %S' -o "$work/cpu" "$@")
  fi
  if [ -n "$pstat" ]; then
    wait "$pstat" || true
    cs_t=$(awk -F, '/context-switches/ { print $1 }' "$work/cs-target")
  fi
  t1=$([ -n "${TPID:-}" ] && cpu_of "$TPID" || echo 0)
  o1=$(cpu_of "$osd_pid")
  if [ "${THREADS:-0}" = 1 ] && [ -n "${TPID:-}" ]; then
    threads_of "$TPID" >"$work/threads.1"
    python3 -c 'import json,sys; a,b=(json.load(open(f)) for f in sys.argv[1:3]); print(json.dumps({k: round(v-a.get(k,0),3) for k,v in b.items() if v-a.get(k,0) > 0}))' \
      "$work/threads.0" "$work/threads.1" >"$work/threads.last"
  fi
  cpu=$(awk '{ printf "%.3f", $1 + $2 }' "$work/cpu")
  echo "${line:-0 0 0} $cpu $(python3 -c "print(f'{$t1-$t0:.3f} {$o1-$o0:.3f}')") ${cs_c:-0} ${cs_t:-0}"
}

# Writes through the target: Reservoir's own initiator (iscsi-perf only reads), QD32.
rsvw() { # bs rand|seq [url] -> "IOPS MBs BYTES"
  timeout $((SECS + 30)) "$RSV" bench --rw write --pattern "$2" --block-size "$1" \
    --queue-depth 32 --duration "$SECS" --json "${3:-$URL}" 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin); print(int(r["iops"]), int(r["MB_per_s"]), r["ios"] * r["block_size"])'
}
qbench() { # url bytes -> "IOPS MBs"; sequential reads, depth 32, for about SECS
  local count=$(($2 >= 1048576 ? SECS * 200 : SECS * 4000)) t0 t1
  t0=$(date +%s.%N)
  timeout $((SECS * 6 + 60)) qemu-img bench -f raw -d 32 -c "$count" -s "$2" -n "$1" >/dev/null 2>&1 || { echo "0 0 0"; return; }
  t1=$(date +%s.%N)
  python3 -c "d=$t1-$t0; print(int($count/d), int($count*$2/d/1e6), $count*$2)"
}
# With THREADS=1: keeps the last measured run's CPU per target thread under a label.
keep_threads() {
  if [ "${THREADS:-0}" = 1 ] && [ -f "$work/threads.last" ]; then
    mv "$work/threads.last" "$work/threads.row.$1"
  fi
  return 0
}
export -f iperf fio_rbd rsvw qbench
export SECS URL CEPH_CONF RSV

p4=$(TPID=$target_pid CS=1 measured bash -c 'iperf 8 rand')
keep_threads 4k
f4=$(CS=1 measured bash -c 'fio_rbd 4k randread')
p4n=$(TPID=$target_pid CS=1 measured bash -c 'iperf 8 rand "$0"' "$URL_NOCACHE")
keep_threads 4k-nocache
p1=$(TPID=$target_pid measured bash -c 'iperf 2048 seq')
keep_threads 1m
p1n=$(TPID=$target_pid measured bash -c 'iperf 2048 seq "$0"' "$URL_NOCACHE")
f1=$(measured bash -c 'fio_rbd 1m read')
f1r=$(measured bash -c 'fio_rbd 1m randread')
if [ -n "$base_pid" ]; then
  b4=$(TPID=$base_pid CS=1 measured bash -c 'iperf 8 rand "$0"' "$URL_BASE")
  keep_threads 4k-base
  b1=$(TPID=$base_pid measured bash -c 'iperf 2048 seq "$0"' "$URL_BASE")
fi
q4r=$(measured bash -c 'qbench "$0" 4096' "$RBD_URL")
q4i=$(TPID=$target_pid measured bash -c 'qbench "$0" 4096' "$URL")
q1r=$(measured bash -c 'qbench "$0" 1048576' "$RBD_URL")
q1i=$(TPID=$target_pid measured bash -c 'qbench "$0" 1048576' "$URL")
# Writes (the image stays fully allocated: every write overwrites data).
w4=$(TPID=$target_pid CS=1 measured bash -c 'rsvw 4k rand')
keep_threads w4k
fw4=$(CS=1 measured bash -c 'fio_rbd 4k randwrite')
w4n=$(TPID=$target_pid CS=1 measured bash -c 'rsvw 4k rand "$0"' "$URL_NOCACHE")
keep_threads w4k-nocache
w1=$(TPID=$target_pid measured bash -c 'rsvw 1M seq')
keep_threads w1m
fw1=$(measured bash -c 'fio_rbd 1m write')
w1n=$(TPID=$target_pid measured bash -c 'rsvw 1M seq "$0"' "$URL_NOCACHE")
if [ -n "$base_pid" ]; then
  bw4=$(TPID=$base_pid CS=1 measured bash -c 'rsvw 4k rand "$0"' "$URL_BASE")
  keep_threads w4k-base
  bw1=$(TPID=$base_pid measured bash -c 'rsvw 1M seq "$0"' "$URL_BASE")
fi
load_end=$(load)

ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
col() { cut -d' ' -f"$2" <<<"$1"; }
# A row: IOPS, MB/s, bytes moved, CPU seconds of the client, target and OSD, context
# switches of the client and target.
# CPU seconds per GiB moved of column $2 (4 client, 5 target, 6 OSD).
per_gib() { python3 -c "b=$(col "$1" 3)/2**30; print(f'{$(col "$1" "$2")/b:.1f}' if b else 'n/a')"; }
# Context switches per read of column $2 (7 client, 8 target); blank when not counted.
per_io() { python3 -c "n=$(col "$1" "$2"); i=$(col "$1" 1)*$SECS; print(f'{n/i:.1f}' if n and i else '')"; }
printf '%-44s %9s %7s %7s | %-18s | %s\n' workload IOPS MB/s ÷librbd \
  "CPU s/GiB cl tg osd" "cs/read cl tg"
row() {
  printf '%-44s %9s %7s %7s | %5s %5s %5s      | %s %s\n' "$1" "$(col "$2" 1)" "$(col "$2" 2)" \
    "${3:-}" "$(per_gib "$2" 4)" "$(per_gib "$2" 5)" "$(per_gib "$2" 6)" \
    "$(per_io "$2" 7)" "$(per_io "$2" 8)"
}
row "4 KiB random read QD32: fio rbd engine" "$f4"
row "  Reservoir over RBD, iscsi-perf" "$p4" "$(ratio "$(col "$p4" 1)" "$(col "$f4" 1)")"
row "  Reservoir over RBD cache=no, iscsi-perf" "$p4n" "$(ratio "$(col "$p4n" 1)" "$(col "$f4" 1)")"
[ -n "$base_pid" ] && row "  base build, iscsi-perf" "$b4" "$(ratio "$(col "$b4" 1)" "$(col "$f4" 1)")"
row "1 MiB read QD32: fio rbd engine, sequential" "$f1"
row "  fio rbd engine, random" "$f1r"
# librbd's better 1 MiB figure is the reference (its sequential reads may trail its random ones).
f1best=$(python3 -c "print(max($(col "$f1" 2), $(col "$f1r" 2)))")
row "  Reservoir over RBD, iscsi-perf, sequential" "$p1" "$(ratio "$(col "$p1" 2)" "$f1best")"
row "  Reservoir over RBD cache=no, iscsi-perf, seq" "$p1n" "$(ratio "$(col "$p1n" 2)" "$f1best")"
[ -n "$base_pid" ] && row "  base build, iscsi-perf, sequential" "$b1" "$(ratio "$(col "$b1" 2)" "$f1best")"
row "qemu-img bench 4 KiB seq QD32: rbd:" "$q4r"
row "  qemu-img bench through Reservoir" "$q4i" "$(ratio "$(col "$q4i" 1)" "$(col "$q4r" 1)")"
row "qemu-img bench 1 MiB seq QD32: rbd:" "$q1r"
row "  qemu-img bench through Reservoir" "$q1i" "$(ratio "$(col "$q1i" 2)" "$(col "$q1r" 2)")"
row "4 KiB random write QD32: fio rbd engine" "$fw4"
row "  Reservoir over RBD, rsv bench" "$w4" "$(ratio "$(col "$w4" 1)" "$(col "$fw4" 1)")"
row "  Reservoir over RBD cache=no, rsv bench" "$w4n" "$(ratio "$(col "$w4n" 1)" "$(col "$fw4" 1)")"
[ -n "$base_pid" ] && row "  base build, rsv bench" "$bw4" "$(ratio "$(col "$bw4" 1)" "$(col "$fw4" 1)")"
row "1 MiB sequential write QD32: fio rbd engine" "$fw1"
row "  Reservoir over RBD, rsv bench" "$w1" "$(ratio "$(col "$w1" 2)" "$(col "$fw1" 2)")"
row "  Reservoir over RBD cache=no, rsv bench" "$w1n" "$(ratio "$(col "$w1n" 2)" "$(col "$fw1" 2)")"
[ -n "$base_pid" ] && row "  base build, rsv bench" "$bw1" "$(ratio "$(col "$bw1" 2)" "$(col "$fw1" 2)")"
if [ "${THREADS:-0}" = 1 ]; then
  echo "target CPU s/GiB by thread (THREADS=1):"
  for f in "$work"/threads.row.*; do
    [ -f "$f" ] || continue
    l=${f##*/threads.row.}
    case $l in 4k) r=$p4 ;; 4k-nocache) r=$p4n ;; 4k-base) r=${b4:-} ;; 1m) r=$p1 ;;
      w4k) r=$w4 ;; w4k-nocache) r=$w4n ;; w4k-base) r=${bw4:-} ;; w1m) r=$w1 ;; *) continue ;; esac
    python3 -c 'import json,sys; t=json.load(open(sys.argv[1])); g=int(sys.argv[2])/2**30; print(f"  {sys.argv[3]:<12}", "  ".join(f"{k} {v/g:.2f}" for k,v in sorted(t.items(), key=lambda x: -x[1])) if g else "n/a")' \
      "$f" "$(col "$r" 3)" "$l"
  done
fi
echo "load average: start $load_start, end $load_end; $(nproc) CPUs; image ${SIZE_MB} MiB, memstore"
echo "CPU s/GiB: cl = the client process (fio with librbd, iscsi-perf, qemu-img), tg = the target, osd = the OSD"
# A row as JSON: figures, CPU seconds (client, target, OSD) and context switches.
js() { local r=$1; [ -z "$r" ] && { echo null; return; }
  echo "{\"iops\": $(col "$r" 1), \"mbs\": $(col "$r" 2), \"bytes\": $(col "$r" 3), \"cpu_s\": [$(col "$r" 4), $(col "$r" 5), $(col "$r" 6)], \"cs\": [$(col "$r" 7), $(col "$r" 8)]}"; }
cat >"$OUT" <<JSON
{"seconds": $SECS, "nproc": $(nproc), "load_start": "$load_start", "load_end": "$load_end",
 "rand_4k_qd32": {"reservoir_iscsi_perf": $(js "$p4"), "reservoir_iscsi_perf_cache_no": $(js "$p4n"), "base_iscsi_perf": $(js "${b4:-}"), "fio_rbd": $(js "$f4")},
 "read_1m_qd32": {"reservoir_iscsi_perf_seq": $(js "$p1"), "reservoir_iscsi_perf_seq_cache_no": $(js "$p1n"), "base_iscsi_perf_seq": $(js "${b1:-}"), "fio_rbd_seq": $(js "$f1"), "fio_rbd_rand": $(js "$f1r")},
 "qemu_img_bench_4k": {"rbd": $(js "$q4r"), "reservoir": $(js "$q4i")},
 "qemu_img_bench_1m": {"rbd": $(js "$q1r"), "reservoir": $(js "$q1i")},
 "randwrite_4k_qd32": {"reservoir_rsv_bench": $(js "$w4"), "reservoir_rsv_bench_cache_no": $(js "$w4n"), "base_rsv_bench": $(js "${bw4:-}"), "fio_rbd": $(js "$fw4")},
 "write_1m_qd32": {"reservoir_rsv_bench_seq": $(js "$w1"), "reservoir_rsv_bench_seq_cache_no": $(js "$w1n"), "base_rsv_bench_seq": $(js "${bw1:-}"), "fio_rbd_seq": $(js "$fw1")}}
JSON
