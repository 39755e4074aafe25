#!/usr/bin/env bash
# Benchmark (not a test): libiscsi's iscsi-perf against Reservoir's target and against tgt,
# both started here on loopback over the same kind of backing store (a file in /dev/shm),
# in the same run; plus single-stream iperf3 on loopback as the network ceiling.
#
#   scripts/bench-target.sh [SECONDS]      (default 10 s per measurement)
#
# Prints one table and the ratios; --json-style lines go to $OUT (default bench-target.json).
# Environment: RSV=path to a built rsv (else `cargo build --release` here, honouring
# CARGO_TARGET_DIR), e.g. to compare two builds of Reservoir in one sitting.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
OUT=${OUT:-bench-target.json}
./scripts/setup.sh
if [ -z "${RSV:-}" ]; then
  cargo build --release --bin rsv >/dev/null
  RSV=${CARGO_TARGET_DIR:-$PWD/target}/release/rsv
fi

work=$(mktemp -d /dev/shm/rsv-bench.XXXXXX)
. scripts/bench-peers.sh
cleanup() {
  stop_peers
  rm -rf "$work"
}
trap cleanup EXIT

# Both images hold the same random data, all of them: reads hit data, not holes (a hole
# reads as the shared zero page, a cheaper copy that flattered whichever target read more
# of them).
head -c 1G /dev/urandom >"$work/rsv.img"
cp "$work/rsv.img" "$work/tgt.img"
start_peers bench

# iscsi-perf prints "iops average N (M MB/s)" last.
perf() { # url blocks_per_request random?
  local args=(-b "$2" -m 32 -t "$SECS")
  [ "$3" = rand ] && args+=(-r)
  timeout $((SECS + 20)) iscsi-perf "${args[@]}" "$1" 2>&1 | tr '\r' '\n' | grep -o 'iops average [0-9]* ([0-9]* MB/s)' | tail -1
}
iops() { sed -E 's/iops average ([0-9]+).*/\1/' <<<"$1"; }
mbs() { sed -E 's/.*\(([0-9]+) MB\/s\)/\1/' <<<"$1"; }

r_seq=$(perf "$RSV_URL" 2048 seq); t_seq=$(perf "$TGT_URL" 2048 seq)
r_rnd=$(perf "$RSV_URL" 8 rand); t_rnd=$(perf "$TGT_URL" 8 rand)

iport=$(free_port)
iperf3 -s -1 -p "$iport" -D >/dev/null 2>&1 || true
sleep 0.3
ipf=$(timeout $((SECS + 20)) iperf3 -c 127.0.0.1 -p "$iport" -t "$SECS" -J 2>/dev/null | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e6))' || echo 0)

ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
printf '%-38s %12s %12s %8s\n' workload reservoir tgt ratio
printf '%-38s %9s MB/s %7s MB/s %8s\n' "1 MiB sequential read, QD32" "$(mbs "$r_seq")" "$(mbs "$t_seq")" "$(ratio "$(mbs "$r_seq")" "$(mbs "$t_seq")")"
printf '%-38s %9s IOPS %7s IOPS %8s\n' "4 KiB random read, QD32" "$(iops "$r_rnd")" "$(iops "$t_rnd")" "$(ratio "$(iops "$r_rnd")" "$(iops "$t_rnd")")"
printf '%-38s %9s MB/s\n' "iperf3 single stream, loopback" "$ipf"
printf '%-38s %12s\n' "reservoir seq / iperf3" "$(ratio "$(mbs "$r_seq")" "$ipf")"
cat > "$OUT" <<JSON
{"seconds": $SECS, "nproc": $(nproc),
 "seq_1m_qd32_mbs": {"reservoir": $(mbs "$r_seq"), "tgt": $(mbs "$t_seq")},
 "rand_4k_qd32_iops": {"reservoir": $(iops "$r_rnd"), "tgt": $(iops "$t_rnd")},
 "iperf3_loopback_mbs": $ipf}
JSON
