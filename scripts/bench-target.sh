#!/usr/bin/env bash
# Benchmark (not a test): libiscsi's iscsi-perf against Reservoir's target and against tgt,
# both started here on loopback over the same kind of backing store (a file in /dev/shm),
# in the same run; Reservoir's target again with `rsv bench` over 1, 2, 4 and 8 connections
# in one session (tgt grants one); plus single-stream iperf3 on loopback as the network's
# ceiling, with its default 128 KiB writes and with 1 MiB writes (`-l 1M`, what a 1 MiB read
# hands the socket).
#
#   scripts/bench-target.sh [SECONDS]      (default 10 s per measurement)
#
# Every row has the CPU seconds per GiB read of both sides (the initiator from its rusage,
# the target from /proc/PID/stat), over the tool's whole run. Flame graphs of Reservoir's
# target and of iscsi-perf on the 1 MiB and 4 KiB rows (one more, unmeasured run each,
# under `perf record`): $FLAME_DIR/target-{4k,1m}-{initiator,target}.svg (default
# lab/bench/flame; FLAME=0: none).
#
# Prints one table and the ratios; JSON to $OUT (default lab/bench/target.json).
# Environment: RSV=path to a built rsv (else `cargo build --release` here, honouring
# CARGO_TARGET_DIR), e.g. to compare two builds of Reservoir in one sitting; CONNS (default
# "1 2 4 8"); RSV_TARGET_TOML (appended to the target's configuration, see bench-peers.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
OUT=${OUT:-lab/bench/target.json}
CONNS=${CONNS:-1 2 4 8}
QD=32
. scripts/bench-peers.sh
build_rsv --setup
peers_work rsv-bench

# Both images hold the same random data, all of them: reads hit data, not holes (a hole
# reads as the shared zero page, a cheaper copy that flattered whichever target read more
# of them).
head -c 1G /dev/urandom >"$work/rsv.img"
cp "$work/rsv.img" "$work/tgt.img"
start_peers bench
load0=$(cut -d' ' -f1-3 /proc/loadavg)

# iscsi-perf prints "iops average N (M MB/s)" last.
perf_args() { # url blocks_per_request random?
  local args=(-b "$2" -m "$QD" -t "$SECS")
  [ "$3" = rand ] && args+=(-r)
  echo "${args[@]}" "$1"
}
perf_iops() { # url blocks_per_request random? target-pid
  # shellcheck disable=SC2046
  with_cpu "$4" timeout $((SECS + 20)) iscsi-perf $(perf_args "$1" "$2" "$3") 2>&1 | tr '\r' '\n' |
    grep -o 'iops average [0-9]*' | tail -1 | grep -o '[0-9]*$' || echo 0
}
rsvb() { # url bytes seq|rand target-pid connections
  with_cpu "$4" timeout $((SECS + 30)) "$RSV" bench --json --rw read --pattern "$3" --block-size "$2" \
    --queue-depth "$QD" --connections "$5" --duration "$SECS" "$1" 2>"$work/bench.err" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["iops"]), d["connections"])' ||
    { cat "$work/bench.err" >&2; echo "0 0"; }
}

declare -A R C N
for wl in seq:1048576:2048 rand:4096:8; do
  IFS=: read -r pat io blocks <<<"$wl"
  R[$pat.rsv.perf]=$(perf_iops "$RSV_URL" "$blocks" "$pat" "$rsv_pid"); C[$pat.rsv.perf]=$(cat "$work/cpu")
  R[$pat.tgt.perf]=$(perf_iops "$TGT_URL" "$blocks" "$pat" "$tgt_pid"); C[$pat.tgt.perf]=$(cat "$work/cpu")
  read -r R[$pat.tgt.rsv] _ <<<"$(rsvb "$TGT_URL" "$io" "$pat" "$tgt_pid" 1)"; C[$pat.tgt.rsv]=$(cat "$work/cpu")
  for c in $CONNS; do
    read -r R[$pat.rsv.c$c] N[$pat.rsv.c$c] <<<"$(rsvb "$RSV_URL" "$io" "$pat" "$rsv_pid" "$c")"
    C[$pat.rsv.c$c]=$(cat "$work/cpu")
  done
done

iperf() { # extra iperf3 client flags
  local iport
  iport=$(free_port)
  iperf3 -s -1 -p "$iport" -D >/dev/null 2>&1 || true
  sleep 0.3
  timeout $((SECS + 20)) iperf3 -c 127.0.0.1 -p "$iport" -t "$SECS" -J "$@" 2>/dev/null |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6))' || echo 0
}
ipf=$(iperf)
ipf1m=$(iperf -l 1M)
load=$(cut -d' ' -f1-3 /proc/loadavg)
if [ "$FLAME" != 0 ]; then
  for wl in seq:2048:1m rand:8:4k; do
    IFS=: read -r pat blocks name <<<"$wl"
    # shellcheck disable=SC2046
    flame "target-$name" "$rsv_pid" iscsi-perf $(perf_args "$RSV_URL" "$blocks" "$pat") >/dev/null
  done
fi

ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
mbs() { python3 -c "print(f'{$1*$2/1e6:.0f}')"; }
json_rows=()
row() { # workload target initiator key [base key]
  local v=${R[$3.$4]} cpu=(${C[$3.$4]:-0 0 1}) ig tg
  ig=$(per_gib "${cpu[0]}" "$v" "$IO" "$SECS")
  tg=$(per_gib "${cpu[1]}" "$v" "$IO" "$SECS")
  printf '%-18s %-9s %-22s %8s %6s %7s %8s %8s\n' "$1" "$2" "$5" "$v" "$(mbs "$v" "$IO")" \
    "$([ -n "${6:-}" ] && ratio "$v" "${R[$3.$6]}" || echo "")" "$ig" "$tg"
  json_rows+=("{\"workload\": \"$1\", \"target\": \"$2\", \"initiator\": \"$5\", \"iops\": $v, \"init_cpu_s_per_gib\": $ig, \"target_cpu_s_per_gib\": $tg, \"init_cpu_s\": ${cpu[0]}, \"target_cpu_s\": ${cpu[1]}, \"wall_s\": ${cpu[2]}}")
}
echo
printf '%-18s %-9s %-22s %8s %6s %7s %8s %8s\n' workload target initiator IOPS MB/s ratio "init" "tgt"
printf '%-18s %-9s %-22s %8s %6s %7s %8s %8s\n' "" "" "" "" "" "" "s/GiB" "s/GiB"
for wl in seq:1048576 rand:4096; do
  pat=${wl%%:*} IO=${wl##*:}
  name=$([ "$pat" = rand ] && echo "4 KiB rand., QD$QD" || echo "1 MiB seq., QD$QD")
  row "$name" reservoir "$pat" rsv.perf "iscsi-perf" tgt.perf
  row "$name" tgt "$pat" tgt.perf "iscsi-perf"
  row "$name" tgt "$pat" tgt.rsv "rsv bench, 1 conn."
  first=
  for c in $CONNS; do
    [ -z "$first" ] && first=rsv.c$c
    row "$name" reservoir "$pat" "rsv.c$c" "rsv bench, ${N[$pat.rsv.c$c]} conn." "$first"
  done
done
printf '%-50s %8s MB/s\n' "iperf3 single stream, loopback (128 KiB writes)" "$ipf"
printf '%-50s %8s MB/s\n' "iperf3 single stream, loopback, -l 1M" "$ipf1m"
echo "ratio: iscsi-perf rows Reservoir ÷ tgt; rsv bench rows N connections ÷ the first"
echo "reservoir 1 MiB (iscsi-perf) ÷ iperf3 -l 1M: $(ratio "$(mbs "${R[seq.rsv.perf]}" 1048576)" "$ipf1m");" \
  "target CPU per GiB, reservoir ÷ tgt (iscsi-perf, 1 MiB):" \
  "$(ratio "$(per_gib "$(cut -d' ' -f2 <<<"${C[seq.rsv.perf]}")" "${R[seq.rsv.perf]}" 1048576 "$SECS")" \
    "$(per_gib "$(cut -d' ' -f2 <<<"${C[seq.tgt.perf]}")" "${R[seq.tgt.perf]}" 1048576 "$SECS")")"
echo "s/GiB: CPU seconds per GiB read, each side"
echo "load average before: $load0, after: $load (nproc $(nproc)); ${SECS} s per measurement"
[ "$FLAME" != 0 ] && echo "flame graphs (iscsi-perf on Reservoir): $(ls "$FLAME_DIR"/target-*.svg 2>/dev/null | tr '\n' ' ')"
{
  echo "{\"seconds\": $SECS, \"nproc\": $(nproc), \"loadavg_before\": \"$load0\", \"loadavg\": \"$load\","
  echo " \"iperf3_loopback_mbs\": $ipf, \"iperf3_loopback_1m_mbs\": $ipf1m, \"rows\": ["
  (IFS=,; echo "${json_rows[*]}" | sed 's/},{/},\n{/g')
  echo "]}"
} >"$OUT"
