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
$RSV_LAB wan down --name "$N" >/dev/null 2>&1
$RSV_LAB wan up --name "$N" --rtt 100ms --rate 100mbit --loss "$LOSS" --json > "$D/wan.json" || exit 1
field() { python3 -c "import json,sys;v=json.load(open('$D/wan.json'));print(v$1)"; }
A=$(field "['a']['netns']"); B=$(field "['b']['netns']"); BA=$(field "['b']['addr']")
cleanup() { [ -n "${TP:-}" ] && kill "$TP" 2>/dev/null; wait 2>/dev/null; $RSV_LAB wan down --name "$N" >/dev/null 2>&1; }
trap cleanup EXIT
for ns in "$A" "$B"; do
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_congestion_control=cubic \
    net.ipv4.tcp_wmem="4096 16384 4194304" net.ipv4.tcp_rmem="4096 131072 33554432"
done
cat > "$D/target.toml" <<T
[session]
congestion = "$CC"
[[target]]
iqn = "iqn.2026-11.org.reservoir:lab"
[[target.lun]]
id = 0
backstore = "ram"
size = "1GiB"
T
ip netns exec "$B" env RUST_LOG=info $RSV target --listen "$BA:3260" --data-dir "$D/data" \
  --config "$D/target.toml" > "$D/target.log" 2>&1 &
TP=$!
for _ in $(seq 100); do grep -q '^ready' "$D/target.log" && break; sleep 0.1; done
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
