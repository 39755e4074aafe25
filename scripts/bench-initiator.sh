#!/usr/bin/env bash
# Benchmark (not a test): Reservoir's initiator (`rsv bench`) against libiscsi's iscsi-perf,
# both reading from Reservoir's target and from tgt, started here on loopback over the same
# kind of backing store (a file in /dev/shm filled with random data), in the same run.
#
#   scripts/bench-initiator.sh [SECONDS]      (default 10 s per measurement)
#
# Workloads, both QD32 over the whole LUN: 4 KiB random reads and 1 MiB sequential reads.
# Each tool runs alone (one at a time). rsv bench runs with 1 connection on both targets and
# with 4 on Reservoir's (tgt grants one). The ratios are rsv / iscsi-perf on the same target
# and workload, from IOPS (same block size, so the same as from throughput).
#
# rsv proposes ErrorRecoveryLevel 2 and libiscsi always 0 (lib/login.c), and Reservoir's
# target lends a large read's data straight from the store only below ERL 2 (at 2 it copies
# it first, for a possible task reassignment): on Reservoir one more rsv row runs with
# --erl 0, the same session as iscsi-perf's. tgt grants 0 anyway.
#
# Beside each figure: the CPU the initiator and the target used, in cores (CPU seconds over
# the tool's wall time, login included). On two shared cores this says which side bounds a
# row: a target at one core on one connection is the limit for every initiator alike.
#
# Environment: RSV=path to a built rsv (else `cargo build --release` here, honouring
# CARGO_TARGET_DIR); SIZE (default 1GiB); OUT (default bench-initiator.json).
# Both tools share the machine with their target: on few cores the figures move with
# whatever else runs; the load average is printed with the table.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
OUT=${OUT:-bench-initiator.json}
SIZE=${SIZE:-1GiB}
QD=32
if [ -z "${RSV:-}" ]; then
  ./scripts/setup.sh
  cargo build --release --bin rsv >/dev/null
  RSV=${CARGO_TARGET_DIR:-$PWD/target}/release/rsv
fi

work=$(mktemp -d /dev/shm/rsv-ibench.XXXXXX)
. scripts/bench-peers.sh
cleanup() {
  stop_peers
  rm -rf "$work"
}
trap cleanup EXIT

bytes() { python3 -c "
s='$1'.strip().lower(); m={'k':1<<10,'kib':1<<10,'m':1<<20,'mib':1<<20,'g':1<<30,'gib':1<<30}
for k in sorted(m, key=len, reverse=True):
    if s.endswith(k): print(int(float(s[:-len(k)])*m[k])); break
else: print(int(s))"; }

# Both images hold the same random data, so reads hit data, not holes.
size_b=$(bytes "$SIZE")
head -c "$size_b" /dev/urandom >"$work/rsv.img"
cp "$work/rsv.img" "$work/tgt.img"

start_peers ibench

# Block size of a LUN, for iscsi-perf's blocks per request.
block_size() { "$RSV" inq --json "$1" 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("block_size") or d["capacity"]["block_size"])' 2>/dev/null || echo 512; }

# Runs a command and writes "initiator-cores target-cores" to $work/cpu: the command's own
# CPU (its children's rusage) and the target process's (/proc/PID/stat, all its threads),
# each over the command's wall time.
with_cpu() { # target-pid command...
  local pid=$1
  shift
  python3 - "$pid" "$work/cpu" "$@" <<'PY'
import os, resource, subprocess, sys, time
pid, out, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
tick = os.sysconf("SC_CLK_TCK")
def target_cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick  # utime, stime
t0, c0 = time.monotonic(), target_cpu()
rc = subprocess.call(cmd)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
open(out, "w").write(f"{(ru.ru_utime + ru.ru_stime) / wall:.2f} {(target_cpu() - c0) / wall:.2f}\n")
sys.exit(rc)
PY
}
# iscsi-perf prints "iops average N (M MB/s)" last; random LBAs over the whole LUN.
iperf_iops() { # url bytes seq|rand target-pid
  local bs blocks args
  bs=$(block_size "$1")
  blocks=$(($2 / bs))
  args=(-b "$blocks" -m "$QD" -t "$SECS")
  [ "$3" = rand ] && args+=(-r)
  with_cpu "$4" timeout $((SECS + 30)) iscsi-perf "${args[@]}" "$1" 2>&1 | tr '\r' '\n' |
    grep -o 'iops average [0-9]*' | tail -1 | grep -o '[0-9]*$' || echo 0
}
# rsv bench over the whole LUN, the same QD and duration, queue depth and connections
# pinned so that auto-tuning changes neither.
rsv_iops() { # url bytes seq|rand target-pid connections [extra flags]
  with_cpu "$4" timeout $((SECS + 30)) "$RSV" bench --json --rw read --pattern "$3" --block-size "$2" \
    --queue-depth "$QD" --connections "$5" --duration "$SECS" "${@:6}" "$1" 2>"$work/bench.err" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["iops"]), d["connections"])' ||
    { cat "$work/bench.err" >&2; echo "0 0"; }
}

declare -A R C
for wl in rand:4096 seq:1048576; do
  pat=${wl%%:*} io=${wl##*:}
  R[$pat.tgt.perf]=$(iperf_iops "$TGT_URL" "$io" "$pat" "$tgt_pid")
  C[$pat.tgt.perf]=$(cat "$work/cpu")
  read -r R[$pat.tgt.rsv1] _ <<<"$(rsv_iops "$TGT_URL" "$io" "$pat" "$tgt_pid" 1)"
  C[$pat.tgt.rsv1]=$(cat "$work/cpu")
  R[$pat.rsv.perf]=$(iperf_iops "$RSV_URL" "$io" "$pat" "$rsv_pid")
  C[$pat.rsv.perf]=$(cat "$work/cpu")
  read -r R[$pat.rsv.rsv1] _ <<<"$(rsv_iops "$RSV_URL" "$io" "$pat" "$rsv_pid" 1)"
  C[$pat.rsv.rsv1]=$(cat "$work/cpu")
  read -r R[$pat.rsv.rsv1e0] _ <<<"$(rsv_iops "$RSV_URL" "$io" "$pat" "$rsv_pid" 1 --erl 0)"
  C[$pat.rsv.rsv1e0]=$(cat "$work/cpu")
  read -r R[$pat.rsv.rsv4] R[$pat.rsv.rsv4c] <<<"$(rsv_iops "$RSV_URL" "$io" "$pat" "$rsv_pid" 4)"
  C[$pat.rsv.rsv4]=$(cat "$work/cpu")
done
load=$(cut -d' ' -f1-3 /proc/loadavg)

ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
mbs() { python3 -c "print(f'{$1*$2/1e6:.0f}')"; }
echo
row() { # workload target initiator key base
  local v=${R[$4]} cpu=(${C[$4]:-? ?})
  printf '%-22s %-10s %-26s %10s %9s %12s %9s %9s\n' "$1" "$2" "$3" "$v" "$(mbs "$v" "$io")" \
    "$([ "$4" = "$5" ] && echo "" || ratio "$v" "${R[$5]}")" "${cpu[0]}" "${cpu[1]}"
}
printf '%-22s %-10s %-26s %10s %9s %12s %9s %9s\n' workload target initiator IOPS MB/s "÷iscsi-perf" \
  "init CPU" "tgt CPU"
for wl in rand:4096 seq:1048576; do
  pat=${wl%%:*} io=${wl##*:}
  name=$([ "$pat" = rand ] && echo "4 KiB random, QD$QD" || echo "1 MiB sequential, QD$QD")
  for t in tgt rsv; do
    tname=$([ "$t" = rsv ] && echo reservoir || echo tgt)
    row "$name" "$tname" "iscsi-perf" "$pat.$t.perf" "$pat.$t.perf"
    row "$name" "$tname" "rsv bench, 1 connection" "$pat.$t.rsv1" "$pat.$t.perf"
    if [ "$t" = rsv ]; then
      row "$name" "$tname" "rsv bench, 1 conn., ERL 0" "$pat.rsv.rsv1e0" "$pat.rsv.perf"
      row "$name" "$tname" "rsv bench, ${R[$pat.rsv.rsv4c]} connections" "$pat.rsv.rsv4" "$pat.rsv.perf"
    fi
  done
done
echo "CPU columns: cores used by the initiator and by the target during each measurement"
echo "load average at the end: $load (nproc $(nproc)); ${SECS} s per measurement"
cpu() { local c=(${C[$1]:-0 0}); echo "[${c[0]}, ${c[1]}]"; }
cat >"$OUT" <<JSON
{"seconds": $SECS, "nproc": $(nproc), "loadavg": "$load", "queue_depth": $QD,
 "rand_4k_iops": {"tgt": {"iscsi_perf": ${R[rand.tgt.perf]}, "rsv_1c": ${R[rand.tgt.rsv1]}},
                  "reservoir": {"iscsi_perf": ${R[rand.rsv.perf]}, "rsv_1c": ${R[rand.rsv.rsv1]}, "rsv_1c_erl0": ${R[rand.rsv.rsv1e0]}, "rsv_4c": ${R[rand.rsv.rsv4]}}},
 "seq_1m_iops": {"tgt": {"iscsi_perf": ${R[seq.tgt.perf]}, "rsv_1c": ${R[seq.tgt.rsv1]}},
                 "reservoir": {"iscsi_perf": ${R[seq.rsv.perf]}, "rsv_1c": ${R[seq.rsv.rsv1]}, "rsv_1c_erl0": ${R[seq.rsv.rsv1e0]}, "rsv_4c": ${R[seq.rsv.rsv4]}}},
 "cpu_cores_initiator_target": {
   "rand_4k": {"tgt": {"iscsi_perf": $(cpu rand.tgt.perf), "rsv_1c": $(cpu rand.tgt.rsv1)},
               "reservoir": {"iscsi_perf": $(cpu rand.rsv.perf), "rsv_1c": $(cpu rand.rsv.rsv1), "rsv_1c_erl0": $(cpu rand.rsv.rsv1e0), "rsv_4c": $(cpu rand.rsv.rsv4)}},
   "seq_1m": {"tgt": {"iscsi_perf": $(cpu seq.tgt.perf), "rsv_1c": $(cpu seq.tgt.rsv1)},
              "reservoir": {"iscsi_perf": $(cpu seq.rsv.perf), "rsv_1c": $(cpu seq.rsv.rsv1), "rsv_1c_erl0": $(cpu seq.rsv.rsv1e0), "rsv_4c": $(cpu seq.rsv.rsv4)}}}}
JSON
