#!/usr/bin/env bash
# Benchmark (not a test): plaintext against TLS over an emulated link (issue 18, lab R3's
# 1 Gbit/s 1 ms rows without the rest of the lab), with the emulator's relay's CPU.
#
#   scripts/bench-tls-link.sh RSV ROW...
#
# Each ROW is MODE:RW[:SECS]: MODE plain, aes128, aes256 or chacha20; RW read or write;
# SECS (default 8). Brings up `rsv-lab wan` (the one beside RSV; RATE, default 1gbit; RTT, default 1ms; LOSS),
# the namespaces' TCP as the lab sets it, `rsv target` with a RAM LUN of 1 GiB and a
# plaintext and a TLS portal in site b, writes the LUN for 4 s, then runs `rsv bench`
# (1 MiB sequential, QD, default 16) from site a for each row in turn and prints MB/s and
# CPU seconds per GB of the target, the initiator and the relay. CAP=1: after each row a
# 1-s run captured by tcpdump in the sender's namespace, to OUTDIR/cap-MODE-RW.pcap
# (`rsv-lab timing --link-rate 1gbit` reads it). PERF=target|init: `perf record -g` of that
# side for 3 s in the middle of each row, to OUTDIR/perf-MODE-RW-SIDE.data. NAME: the
# link's name (default ${RSV_LAB_PREFIX}tlslink). Run it under the exclusive bench lock.
set -euo pipefail
RSV=$(realpath "$1"); shift
RSV_LAB=$(dirname "$RSV")/rsv-lab
RATE=${RATE:-1gbit}; RTT=${RTT:-1ms}; NAME=${NAME:-${RSV_LAB_PREFIX:-}tlslink}; QD=${QD:-16}
OUTDIR=${OUTDIR:-.}
work=$(mktemp -d /tmp/rsv-tlslink.XXXXXX)
pid=
cleanup() { set +e; [ -n "$pid" ] && kill $pid 2>/dev/null && timeout 10 tail --pid=$pid -f /dev/null; $RSV_LAB wan down --name $NAME >/dev/null 2>&1; rm -rf "$work"; }
trap cleanup EXIT
. "$(dirname "$0")/lib.sh"
wan_up $NAME --hosts-a 1 --rate $RATE --rtt $RTT ${LOSS:+--loss $LOSS}
read nsa nsb addr relay < <(wan_get "v['a']['hosts'][0]['netns'], v['b']['hosts'][0]['netns'], v['b']['hosts'][0]['addr'], v.get('pid',0)")
lab_tcp $nsa $nsb
iqn=iqn.2026-11.org.reservoir:tlslink
tls_target_toml $work $addr:3260 $addr:3261 $iqn 1GiB > $work/t.toml
pin=$PIN
start_ready $work/t.out $work/t.log ip netns exec $nsb env RUST_LOG=warn $RSV target --config $work/t.toml || true
pid=$STARTED_PID
cpu() { python3 -c "
import os,sys
f=open('/proc/%s/stat'%sys.argv[1]).read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))" $1; }
url() { if [ $1 = plain ]; then echo "iscsi://$addr:3260/$iqn/0"; else echo "iscsi://$addr:3261/$iqn/0?pin=$pin&tls_suite=$1"; fi; }
# write the LUN first
ip netns exec $nsa $RSV bench --rw write --pattern seq --block-size 1M --queue-depth $QD --duration 4 "$(url plain)" >/dev/null
echo "load $(cat /proc/loadavg)"
for row in "$@"; do
  IFS=: read mode rw secs <<<"$row"; secs=${secs:-8}
  t0=$(cpu $pid); r0=$(cpu $relay)
  /usr/bin/time -f "%e %U %S" -o $work/time ip netns exec $nsa $RSV bench --json --rw $rw --pattern seq --block-size 1M --queue-depth $QD --duration $secs "$(url $mode)" > $work/b.json &
  bp=$!
  if [ -n "${PERF:-}" ]; then
    sleep 2
    if [ $PERF = target ]; then pp=$pid; else pp=$(pgrep -f "bench --json --rw $rw" | tail -1); fi
    perf record -g -o $OUTDIR/perf-$mode-$rw-$PERF.data -p $pp -- sleep 3 >/dev/null 2>&1
  fi
  wait $bp
  t1=$(cpu $pid); r1=$(cpu $relay)
  python3 - "$work/b.json" "$work/time" $t0 $t1 $r0 $r1 $mode $rw <<'PY'
import json,sys
d=json.load(open(sys.argv[1])); e,u,s=map(float,open(sys.argv[2]).read().split()[-3:])
t0,t1,r0,r1=map(float,sys.argv[3:7])
gb=d['ios']*d['block_size']/1e9
print(f"{sys.argv[7]:>8} {sys.argv[8]:<5} {gb/d['seconds']*1000:7.1f} MB/s  CPU s/GB target {(t1-t0)/gb:.3f} init {(u+s)/gb:.3f} relay {(r1-r0)/gb:.3f}")
PY
  if [ -n "${CAP:-}" ]; then
    capns=$nsb; [ $rw = write ] && capns=$nsa
    ip netns exec $capns tcpdump -i any -s 128 -B 131072 -n -w $OUTDIR/cap-$mode-$rw.pcap "tcp port 3260 or tcp port 3261" >/dev/null 2>&1 &
    tp=$!; sleep 1
    ip netns exec $nsa $RSV bench --rw $rw --pattern seq --block-size 1M --queue-depth $QD --duration 1 "$(url $mode)" >/dev/null
    kill $tp; wait $tp 2>/dev/null || true
  fi
done
echo "load $(cat /proc/loadavg)"
