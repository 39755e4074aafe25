#!/usr/bin/env bash
# Samples what the RTT sweep's connections and link do, every 0.1 s until killed: `ss -tin`
# of port 3260 in both of the link's namespaces (cwnd, pacing and delivery rate,
# retransmissions, RTT) and `rsv-lab wan stats --json` (queue, drops, bytes each way).
# Run it beside `RSV_LAB_PREFIX=PREFIX rsv-lab run rtt ...`:
#   scripts/rtt-trace.sh PREFIX OUT [RSV_LAB]   (the link is PREFIXlrtt; root)
# Lines: "T <epoch> a|b" then ss's two lines per socket; "W <epoch> <stats JSON>".
set -u
P=${1:?PREFIX}; OUT=${2:?OUT}; LAB=${3:-rsv-lab}
while true; do
  t=$(date +%s.%N)
  for s in a b; do
    echo "T $t $s"
    ip netns exec "${P}lrtt-$s" ss -tinH '( sport = :3260 or dport = :3260 )' 2>/dev/null
  done
  echo "W $t $("$LAB" wan stats --name "${P}lrtt" --json 2>/dev/null | tr -d '\n')"
  sleep 0.1
done > "$OUT"
