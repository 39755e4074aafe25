#!/usr/bin/env bash
# Highest rate the user-space WAN emulator holds: for each bottleneck rate, one iperf3 TCP
# run (CUBIC, 20 ms RTT, MTU 1500) through a fresh link, reporting the rate on the wire
# (goodput * 1500/1448) as a fraction of the setting. Needs root, iperf3 and iproute2.
#   usage: scripts/wan-bench.sh [RSV_WAN_BINARY] [RATES...]
# RSV_WAN_BINARY is `rsv-lab` or the wan crate's `rsv-wan` (both take `wan up ...`);
# default: build rsv-wan in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-}
if [[ -z $BIN ]]; then
    cargo build --release -q -p wan --bin rsv-wan
    BIN=${CARGO_TARGET_DIR:-target}/release/rsv-wan
fi
shift || true
RATES=${*:-"500mbit 800mbit 1gbit 1200mbit 1500mbit"}
SECONDS_PER_RUN=${WAN_BENCH_SECONDS:-10}
NAME=wanbench
cleanup() { [[ -n ${SERVER:-} ]] && kill "$SERVER" 2>/dev/null; "$BIN" wan down --name $NAME >/dev/null 2>&1 || true; }
trap cleanup EXIT
printf "%-10s %12s %12s %8s\n" rate goodput wire ratio
for rate in $RATES; do
    "$BIN" wan up --name $NAME --rtt 20ms --rate "$rate" --json >/tmp/$NAME.json
    ADDR=$(python3 -c "import json; print(json.load(open('/tmp/$NAME.json'))['b']['addr'])")
    ip netns exec $NAME-b iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    SERVER=$!
    sleep 0.5
    bps=$(ip netns exec $NAME-a iperf3 -c "$ADDR" -p 5201 -t "$SECONDS_PER_RUN" -O 3 -C cubic -J |
        python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second'])")
    wait "$SERVER" 2>/dev/null || true
    SERVER=
    "$BIN" wan down --name $NAME
    python3 - "$rate" "$bps" <<'PY'
import sys, re
rate, bps = sys.argv[1], float(sys.argv[2])
m = re.fullmatch(r"([\d.]+)([kmg]?)bit", rate.lower())
want = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
wire = bps * 1500 / 1448
print(f"{rate:<10} {bps/1e6:9.1f} Mb {wire/1e6:9.1f} Mb {wire/want:8.3f}")
PY
done
