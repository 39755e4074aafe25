#!/usr/bin/env bash
# Benchmark (not a test): Reservoir's initiator (`rsv bench`) against libiscsi's iscsi-perf,
# both reading from Reservoir's target and from tgt, started here on loopback over the same
# kind of backing store (a file in /dev/shm filled with random data), in the same run.
#
#   scripts/bench-initiator.sh [SECONDS]      (default 10 s per measurement)
#
# Workloads, both QD32 over the whole LUN: 4 KiB random reads and 1 MiB sequential reads.
# Each tool runs alone (one at a time). rsv bench runs with 1 connection on both targets and
# with 1, 2, 4 and 8 on Reservoir's (tgt grants one). The ratios are rsv / iscsi-perf on the
# same target and workload, from IOPS (same block size, so the same as from throughput), and
# for Reservoir's rows N connections / 1 connection.
#
# rsv proposes ErrorRecoveryLevel 2 and libiscsi always 0 (lib/login.c); one more rsv row
# runs with --erl 0 on Reservoir, the same session as iscsi-perf's. tgt grants 0 anyway.
#
# Beside each figure: the CPU seconds each side spent per GiB read (the initiator from its
# rusage, the target from /proc/PID/stat, both over the tool's whole run, login included),
# and the cores each used. On two shared cores a throughput ratio follows whoever got the
# cores; CPU per GiB is what each side costs.
#
# Flame graphs: one more (unmeasured) 4-connection run of each workload on Reservoir under
# `perf record`, for the initiator and the target: $FLAME_DIR/{4k,1m}-{initiator,target}.svg
# (default lab/bench/flame; FLAME=0: none).
#
# Environment: RSV=path to a built rsv (else `cargo build --release` here, honouring
# CARGO_TARGET_DIR); SIZE (default 1GiB); OUT (default lab/bench/initiator.json); CONNS (default
# "1 2 4 8"); RSV_TARGET_TOML (appended to the target's configuration, see bench-peers.sh).
# Both tools share the machine with their target: on few cores the figures move with
# whatever else runs; the load average is printed with the table.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
OUT=${OUT:-lab/bench/initiator.json}
SIZE=${SIZE:-1GiB}
CONNS=${CONNS:-1 2 4 8}
QD=32
. scripts/bench-peers.sh
build_rsv --setup
peers_work rsv-ibench

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
load0=$(cut -d' ' -f1-3 /proc/loadavg)

# Block size of a LUN, for iscsi-perf's blocks per request.
block_size() { "$RSV" inq --json "$1" 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("block_size") or d["capacity"]["block_size"])' 2>/dev/null || echo 512; }

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
rsv_args() { # url bytes seq|rand connections [extra flags]
  echo bench --json --rw read --pattern "$3" --block-size "$2" --queue-depth "$QD" \
    --connections "$4" --duration "$SECS" "${@:5}" "$1"
}
rsv_iops() { # url bytes seq|rand target-pid connections [extra flags]
  local pid=$4
  # shellcheck disable=SC2046
  with_cpu "$pid" timeout $((SECS + 30)) "$RSV" $(rsv_args "$1" "$2" "$3" "${@:5}") 2>"$work/bench.err" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["iops"]), d["connections"])' ||
    { cat "$work/bench.err" >&2; echo "0 0"; }
}

declare -A R C N
keys=()
for wl in rand:4096 seq:1048576; do
  pat=${wl%%:*} io=${wl##*:}
  R[$pat.tgt.perf]=$(iperf_iops "$TGT_URL" "$io" "$pat" "$tgt_pid"); C[$pat.tgt.perf]=$(cat "$work/cpu")
  read -r R[$pat.tgt.rsv1] _ <<<"$(rsv_iops "$TGT_URL" "$io" "$pat" "$tgt_pid" 1)"; C[$pat.tgt.rsv1]=$(cat "$work/cpu")
  R[$pat.rsv.perf]=$(iperf_iops "$RSV_URL" "$io" "$pat" "$rsv_pid"); C[$pat.rsv.perf]=$(cat "$work/cpu")
  read -r R[$pat.rsv.e0] _ <<<"$(rsv_iops "$RSV_URL" "$io" "$pat" "$rsv_pid" 1 --erl 0)"; C[$pat.rsv.e0]=$(cat "$work/cpu")
  for c in $CONNS; do
    read -r R[$pat.rsv.c$c] N[$pat.rsv.c$c] <<<"$(rsv_iops "$RSV_URL" "$io" "$pat" "$rsv_pid" "$c")"
    C[$pat.rsv.c$c]=$(cat "$work/cpu")
  done
done
load=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "$FLAME" != 0 ]; then
  for wl in rand:4096:4k seq:1048576:1m; do
    IFS=: read -r pat io name <<<"$wl"
    # shellcheck disable=SC2046
    flame "$name" "$rsv_pid" "$RSV" $(rsv_args "$RSV_URL" "$io" "$pat" 4) >/dev/null
  done
fi

ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
mbs() { python3 -c "print(f'{$1*$2/1e6:.0f}')"; }
echo
json_rows=()
row() { # workload target initiator key base [one-connection key]
  local v=${R[$4]} cpu=(${C[$4]:-0 0 1}) io=$IO
  local ig tg
  ig=$(per_gib "${cpu[0]}" "$v" "$io" "$SECS")
  tg=$(per_gib "${cpu[1]}" "$v" "$io" "$SECS")
  printf '%-20s %-9s %-24s %8s %6s %6s %6s %8s %8s %6s %6s\n' "$1" "$2" "$3" "$v" "$(mbs "$v" "$io")" \
    "$([ "$4" = "$5" ] && echo "" || ratio "$v" "${R[$5]}")" \
    "$([ -n "${6:-}" ] && ratio "$v" "${R[$6]}" || echo "")" "$ig" "$tg" \
    "$(python3 -c "print(f'{${cpu[0]}/${cpu[2]}:.2f}')")" "$(python3 -c "print(f'{${cpu[1]}/${cpu[2]}:.2f}')")"
  json_rows+=("{\"workload\": \"$1\", \"target\": \"$2\", \"initiator\": \"$3\", \"iops\": $v, \"init_cpu_s_per_gib\": $ig, \"target_cpu_s_per_gib\": $tg, \"init_cpu_s\": ${cpu[0]}, \"target_cpu_s\": ${cpu[1]}, \"wall_s\": ${cpu[2]}}")
}
printf '%-20s %-9s %-24s %8s %6s %6s %6s %8s %8s %6s %6s\n' workload target initiator IOPS MB/s \
  "÷perf" "÷1c" "init" "tgt" "init" "tgt"
printf '%-20s %-9s %-24s %8s %6s %6s %6s %8s %8s %6s %6s\n' "" "" "" "" "" "" "" "s/GiB" "s/GiB" cores cores
for wl in rand:4096 seq:1048576; do
  pat=${wl%%:*} IO=${wl##*:}
  name=$([ "$pat" = rand ] && echo "4 KiB random, QD$QD" || echo "1 MiB seq., QD$QD")
  row "$name" tgt "iscsi-perf" "$pat.tgt.perf" "$pat.tgt.perf"
  row "$name" tgt "rsv bench, 1 conn." "$pat.tgt.rsv1" "$pat.tgt.perf"
  row "$name" reservoir "iscsi-perf" "$pat.rsv.perf" "$pat.rsv.perf"
  row "$name" reservoir "rsv bench, 1 conn., ERL 0" "$pat.rsv.e0" "$pat.rsv.perf"
  first=
  for c in $CONNS; do
    [ -z "$first" ] && first=$pat.rsv.c$c
    row "$name" reservoir "rsv bench, ${N[$pat.rsv.c$c]} conn." "$pat.rsv.c$c" "$pat.rsv.perf" "$first"
  done
done
echo "s/GiB: CPU seconds per GiB read, each side; cores: CPU seconds over the tool's wall time"
echo "load average before: $load0, after: $load (nproc $(nproc)); ${SECS} s per measurement"
[ "$FLAME" != 0 ] && echo "flame graphs (4 connections): $(ls "$FLAME_DIR"/*.svg 2>/dev/null | tr '\n' ' ')"
{
  echo "{\"seconds\": $SECS, \"nproc\": $(nproc), \"loadavg_before\": \"$load0\", \"loadavg\": \"$load\", \"queue_depth\": $QD, \"rows\": ["
  (IFS=,; echo "${json_rows[*]}" | sed 's/},{/},\n{/g')
  echo "]}"
} >"$OUT"
