#!/usr/bin/env bash
# Fairness check of issue 21: on one bottleneck (50 ms, 100 Mbit/s, queue one BDP) one
# iperf3 CUBIC flow and one iperf3 BBR flow run beside a third party for SECS (30) s:
#   kernel-bbr  iperf3 -P 2 -C bbr (the reference: as many kernel-BBR connections)
#   $CC         a Reservoir session writing (rsv bench, 2 connections, congestion=$CC, default rsv;
#               CC=default: no congestion option at either end, the processes' default)
#   bbr         the same session on the kernel's BBR
# and prints what each got and the third party's share. Root; namespaces $NAME-a/-b
# (NAME=fair). RSV=path/to/rsv (default target/debug/rsv; the link through the rsv-lab beside it,
# or RSV_LAB). Runs one after another, not at once.
set -u
RSV=${RSV:-$(dirname "$0")/../target/debug/rsv}
RSV_LAB=${RSV_LAB:-$(dirname "$RSV")/rsv-lab}
N=${NAME:-fair}
SECS=${SECS:-30}
$RSV_LAB wan down --name $N >/dev/null 2>&1
D=$(mktemp -d /dev/shm/fairness.XXXX)
$RSV_LAB wan up --name $N --rtt 50ms --rate 100mbit --json > $D/link.json || exit 1
B=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["b"]["addr"])' $D/link.json)
pids=()
for p in 5301 5302 5303; do ip netns exec $N-b iperf3 -s -p $p -D -I $D/iperf-$p.pid --logfile $D/iperf-s-$p.log; done
TCC=(--congestion "${CC:-rsv}"); [ "${CC:-rsv}" = default ] && TCC=()
ip netns exec $N-b $RSV target --listen $B:3260 "${TCC[@]}" --data-dir $D/data > $D/target.log 2>&1 &
TPID=$!
URL="iscsi://$B/iqn.2026-11.org.reservoir:target0/0"
for i in $(seq 50); do ip netns exec $N-a $RSV inq "$URL" >/dev/null 2>&1 && break; sleep 0.2; done
run() { # $1 = label of the third flow
  ip netns exec $N-a iperf3 -c $B -p 5301 -C cubic -t $SECS --json > $D/cubic-$1.json &
  local c=$!
  ip netns exec $N-a iperf3 -c $B -p 5302 -C bbr -t $SECS --json > $D/bbr-$1.json &
  local b=$!
  if [ "$1" = kernel-bbr ]; then
    ip netns exec $N-a iperf3 -c $B -p 5303 -C bbr -P 2 -t $SECS --json > $D/x-$1.json
  else
    ip netns exec $N-a $RSV bench "$URL" --rw write --pattern seq --block-size 1m --duration $SECS --connections 2 $([ "$1" = default ] || echo --opt congestion=$1) --json > $D/x-$1.json 2>$D/x-$1.err
  fi
  wait $c $b
  python3 - "$D" "$1" <<'PY'
import json,sys
d,l=sys.argv[1],sys.argv[2]
def ip(f):
    j=json.load(open(f)); return j["end"]["sum_received"]["bits_per_second"]/1e6
c=ip(f"{d}/cubic-{l}.json"); b=ip(f"{d}/bbr-{l}.json")
if l=="kernel-bbr":
    x=ip(f"{d}/x-{l}.json")
else:
    j=json.load(open(f"{d}/x-{l}.json"))
    x=j["MB_per_s"]*8
    if not x:
        x = j["bytes"]*8/j["seconds"]/1e6 if "bytes" in j and "seconds" in j else 0
tot=c+b+x
print(f"{l:12s} cubic {c:6.2f}  bbr {b:6.2f}  third {x:6.2f} Mbit/s  third's share {100*x/tot:5.1f} % of {tot:6.2f}")
PY
}
for x in kernel-bbr ${CC:-rsv} bbr; do cat /proc/loadavg; run $x; done
cat /proc/loadavg
kill $TPID; wait $TPID 2>/dev/null
for p in 5301 5302 5303; do kill $(cat $D/iperf-$p.pid) 2>/dev/null; done
$RSV_LAB wan down --name $N >/dev/null 2>&1
echo "scratch: $D"
