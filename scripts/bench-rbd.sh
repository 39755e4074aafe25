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
# with `cache=no`, so that both are measured in the same run.
# Reads at queue depth 32: 4 KiB random and 1 MiB (sequential for iscsi-perf's and
# qemu-img's, which have no random large reads; random and sequential for fio). Prints a
# table with each Reservoir figure over librbd's (fio), the load average at the start and
# end (the machine may be shared), and writes $OUT (default bench-rbd.json).
# Environment: RSV=path to a built rsv (else `cargo build --release` here).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
OUT=${OUT:-bench-rbd.json}
SIZE_MB=${SIZE_MB:-1024}
./scripts/setup.sh
if ! command -v fio >/dev/null || ! fio --enghelp 2>/dev/null | grep -qw rbd; then
  echo "bench-rbd: installing fio" >&2
  apt-get install -y -qq --no-install-recommends fio >/dev/null
fi
if [ -z "${RSV:-}" ]; then
  cargo build --release --bin rsv >/dev/null
  RSV=${CARGO_TARGET_DIR:-$PWD/target}/release/rsv
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/rsv-bench-rbd.XXXXXX")
target_pid=
cleanup() {
  [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null && wait "$target_pid" 2>/dev/null
  scripts/ceph-cluster.sh stop "$work/ceph" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)
scripts/ceph-cluster.sh start "$work/ceph" >/dev/null
export CEPH_CONF="$work/ceph/ceph.conf"
# All of the image holds data, so that reads reach the OSD rather than holes.
head -c "${SIZE_MB}M" /dev/urandom >"$work/src.img"
rbd import --no-progress "$work/src.img" bench >/dev/null
rm -f "$work/src.img"

cat >"$work/target.toml" <<EOF
[[target]]
iqn = "iqn.2026-11.org.reservoir:bench-rbd"
[[target.lun]]
id = 0
store = "rbd:rbd/bench?conf=$CEPH_CONF"
[[target.lun]]
id = 1
store = "rbd:rbd/bench?conf=$CEPH_CONF&cache=no"
EOF
"$RSV" target --listen 127.0.0.1:0 --data-dir "$work/data" --config "$work/target.toml" \
  >"$work/target.out" 2>"$work/target.log" &
target_pid=$!
for _ in $(seq 100); do grep -q '^ready' "$work/target.out" && break; sleep 0.1; done
portal=$(sed -n 's/^portal //p' "$work/target.out" | head -1)
URL="iscsi://$portal/iqn.2026-11.org.reservoir:bench-rbd/0"
URL_NOCACHE="iscsi://$portal/iqn.2026-11.org.reservoir:bench-rbd/1"
RBD_URL="rbd:rbd/bench:conf=$CEPH_CONF"

# iscsi-perf prints "iops average N (M MB/s)" last; -r: random LBAs over the whole LUN.
perf() { # blocks_per_request rand|seq [url] -> "IOPS MBs"
  local args=(-b "$1" -m 32 -t "$SECS")
  [ "$2" = rand ] && args+=(-r)
  timeout $((SECS + 20)) iscsi-perf "${args[@]}" "${3:-$URL}" 2>&1 | tr '\r' '\n' |
    grep -o 'iops average [0-9]* ([0-9]* MB/s)' | tail -1 |
    sed -E 's/iops average ([0-9]+) \(([0-9]+) MB\/s\)/\1 \2/'
}
fio_rbd() { # bs randread|read -> "IOPS MBs"
  fio --name=b --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench --rw="$2" \
    --bs="$1" --iodepth=32 --direct=1 --time_based --runtime="$SECS" --output-format=json \
    2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin)["jobs"][0]["read"]; print(int(r["iops"]), int(r["bw_bytes"]/1e6))'
}
qbench() { # url bytes -> "IOPS MBs"; sequential reads, depth 32, for about SECS
  local count=$(($2 >= 1048576 ? SECS * 200 : SECS * 4000)) t0 t1
  t0=$(date +%s.%N)
  timeout $((SECS * 6 + 60)) qemu-img bench -f raw -d 32 -c "$count" -s "$2" -n "$1" >/dev/null 2>&1 || { echo "0 0"; return; }
  t1=$(date +%s.%N)
  python3 -c "d=$t1-$t0; print(int($count/d), int($count*$2/d/1e6))"
}

p4=$(perf 8 rand)
f4=$(fio_rbd 4k randread)
p4n=$(perf 8 rand "$URL_NOCACHE")
p1=$(perf 2048 seq)
p1n=$(perf 2048 seq "$URL_NOCACHE")
f1=$(fio_rbd 1m read)
f1r=$(fio_rbd 1m randread)
q4r=$(qbench "$RBD_URL" 4096)
q4i=$(qbench "$URL" 4096)
q1r=$(qbench "$RBD_URL" 1048576)
q1i=$(qbench "$URL" 1048576)
load_end=$(load)

ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
col() { cut -d' ' -f"$2" <<<"$1"; }
printf '%-44s %10s %9s %8s\n' workload IOPS MB/s ÷librbd
row() { printf '%-44s %10s %9s %8s\n' "$1" "$(col "$2" 1)" "$(col "$2" 2)" "${3:-}"; }
row "4 KiB random read QD32: fio rbd engine" "$f4"
row "  Reservoir over RBD, iscsi-perf" "$p4" "$(ratio "$(col "$p4" 1)" "$(col "$f4" 1)")"
row "  Reservoir over RBD cache=no, iscsi-perf" "$p4n" "$(ratio "$(col "$p4n" 1)" "$(col "$f4" 1)")"
row "1 MiB read QD32: fio rbd engine, sequential" "$f1"
row "  fio rbd engine, random" "$f1r"
# librbd's better 1 MiB figure is the reference (its sequential reads may trail its random ones).
f1best=$(python3 -c "print(max($(col "$f1" 2), $(col "$f1r" 2)))")
row "  Reservoir over RBD, iscsi-perf, sequential" "$p1" "$(ratio "$(col "$p1" 2)" "$f1best")"
row "  Reservoir over RBD cache=no, iscsi-perf, seq" "$p1n" "$(ratio "$(col "$p1n" 2)" "$f1best")"
row "qemu-img bench 4 KiB seq QD32: rbd:" "$q4r"
row "  qemu-img bench through Reservoir" "$q4i" "$(ratio "$(col "$q4i" 1)" "$(col "$q4r" 1)")"
row "qemu-img bench 1 MiB seq QD32: rbd:" "$q1r"
row "  qemu-img bench through Reservoir" "$q1i" "$(ratio "$(col "$q1i" 2)" "$(col "$q1r" 2)")"
echo "load average: start $load_start, end $load_end; $(nproc) CPUs; image ${SIZE_MB} MiB, memstore"
cat >"$OUT" <<JSON
{"seconds": $SECS, "nproc": $(nproc), "load_start": "$load_start", "load_end": "$load_end",
 "rand_4k_qd32_iops": {"reservoir_iscsi_perf": $(col "$p4" 1), "reservoir_iscsi_perf_cache_no": $(col "$p4n" 1), "fio_rbd": $(col "$f4" 1)},
 "read_1m_qd32_mbs": {"reservoir_iscsi_perf_seq": $(col "$p1" 2), "reservoir_iscsi_perf_seq_cache_no": $(col "$p1n" 2), "fio_rbd_seq": $(col "$f1" 2), "fio_rbd_rand": $(col "$f1r" 2)},
 "qemu_img_bench_4k_iops": {"rbd": $(col "$q4r" 1), "reservoir": $(col "$q4i" 1)},
 "qemu_img_bench_1m_mbs": {"rbd": $(col "$q1r" 2), "reservoir": $(col "$q1i" 2)}}
JSON
