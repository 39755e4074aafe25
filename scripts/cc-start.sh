#!/bin/bash
# Where a transfer's start goes (docs/congestion.md): one `rsv bench` over an emulated
# 100 ms / 100 Mbit/s link with a declared rate, `ss -tin` of both ends every 20 ms for
# its 4 s. Needs root.
#   scripts/cc-start.sh [read|write] [CONGESTION] [RATE|none] [LOSS]
# Output in $OUT (default /tmp/cc-start-RW-CC): ss-a.txt (initiator), ss-b.txt (target),
# bench.json, target.log; a summary line at the end.
set -u
RSV=${RSV:-target/release/rsv}
# The emulator is the bench's: the rsv-lab built beside RSV.
RSV_LAB=${RSV_LAB:-$(dirname "$RSV")/rsv-lab}
RW=${1:-read}; CC=${2:-rsv}; RATE=${3:-100mbit}; LOSS=${4:-0%}
N=${RSV_LAB_PREFIX:-}cc-start
D=${OUT:-/tmp/cc-start-$RW-$CC}
rm -rf "$D"; mkdir -p "$D"
. "$(dirname "$0")/lib.sh"
wan_up "$N" --rtt 100ms --rate 100mbit --loss "$LOSS" || exit 1
echo "$WAN_JSON" > "$D/wan.json"
A=$(wan_get "v['a']['netns']"); B=$(wan_get "v['b']['netns']"); BA=$(wan_get "v['b']['addr']")
cleanup() { [ -n "${TP:-}" ] && kill "$TP" 2>/dev/null; wait 2>/dev/null; $RSV_LAB wan down --name "$N" >/dev/null 2>&1; }
trap cleanup EXIT
lab_tcp "$A" "$B"
{ printf '[session]\ncongestion = "%s"\n' "$CC"; target_toml iqn.2026-11.org.reservoir:lab 'backstore = "ram"' 'size = "1GiB"'; } > "$D/target.toml"
start_ready "$D/target.log" "$D/target.log" ip netns exec "$B" env RUST_LOG=info $RSV target --listen "$BA:3260" --data-dir "$D/data" \
  --config "$D/target.toml"
TP=$STARTED_PID
OPTS=(--opt "congestion=$CC"); [ "$RATE" != none ] && OPTS+=(--opt "rate=$RATE")
ip netns exec "$A" $RSV bench "iscsi://$BA:3260/iqn.2026-11.org.reservoir:lab/0" --json \
  --pattern seq --rw "$RW" --block-size 1m --duration 4 "${OPTS[@]}" > "$D/bench.json" 2> "$D/bench.err" &
BP=$!
end=$(( $(date +%s%N) + 4000000000 ))
while [ "$(date +%s%N)" -lt $end ]; do
  t=$(date +%s.%N)
  { echo "@ $t"; ip netns exec "$B" ss -tin state established "( sport = :3260 )"; } >> "$D/ss-b.txt"
  { echo "@ $t"; ip netns exec "$A" ss -tin state established "( dport = :3260 )"; } >> "$D/ss-a.txt"
  sleep 0.02
done
wait $BP
python3 - "$D" <<'P'
import json, sys
d = sys.argv[1]
v = json.load(open(d + '/bench.json'))
print('started_unix_s', v['started_unix_s'], 'Mbit/s', round(v['ios'] * v['block_size'] * 8 / v['seconds'] / 1e6, 2),
      'connections', v['connections'], 'queue depth', v['queue_depth'], '->', d)
P
