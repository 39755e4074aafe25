#!/bin/bash
# Start-of-stream measurement at 24 ms each way, 100 Mbit/s, with a pcap in site a.
# Usage: media-start.sh OUTDIR  (uses $RSV, default ./target/release/rsv, and the rsv-lab beside it
# for the link, or $RSV_LAB; LINK= the
# link's name, SCRATCH= the directory for the image, to keep runs of several people apart)
set -u
RSV=${RSV:-./target/release/rsv}
RSV_LAB=${RSV_LAB:-$(dirname "$RSV")/rsv-lab}
OUT=${1:-/tmp/med-start}
D=${SCRATCH:-/dev/shm/med-start}
L=${LINK:-med-s}
DELAY=${DELAY:-24}
. "$(dirname "$0")/lib.sh"
mkdir -p $OUT
media_image $D 512
wan_up $L --rate 100mbit --delay-ab ${DELAY}ms --delay-ba ${DELAY}ms
NSA=$(wan_get 'v["a"]["netns"]')
NSB=$(wan_get 'v["b"]["netns"]')
B=$(wan_get 'v["b"]["addr"]')
IQN=iqn.2026-11.org.reservoir:med-start
target_toml $IQN 'alias = "home"' -- "store = \"file:$D/media.img\"" > $D/t.toml
start_ready $OUT/target.log $OUT/target.log ip netns exec $NSB env RUST_LOG=warn $RSV target --listen $B:3260 --data-dir $D/data --config $D/t.toml
TP=$STARTED_PID
IF=$(ip netns exec $NSA ip -o link | awk -F': ' '{print $2}' | grep -v lo | head -5 | tr '\n' ' ')
echo "ifaces in $NSA: $IF" > $OUT/info
ip netns exec $NSA tcpdump -i any -s 120 -w $OUT/cap.pcap tcp port 3260 > /dev/null 2>&1 &
CP=$!
sleep 1
if [ -n "${READ:-}" ]; then
  # Throughput instead: the lab's reader, the whole file in 32 KiB calls.
  # CPU seconds of the reader and of the target over the read, beside the rate.
  tcpu() { awk '{print $14+$15}' /proc/$TP/stat 2>/dev/null || echo 0; }
  T0=$(tcpu)
  TIMEFORMAT='%U %S'
  { time ip netns exec $NSA timeout 120 $RSV media --read /movie.mp4 --call-size 32K ${MRATE:-} "iscsi://$B:3260/$IQN/0${QUERY:-}" > $OUT/read.json 2> $OUT/read.log ; } 2> $OUT/read.cpu
  T1=$(tcpu)
  TCK=$(getconf CLK_TCK)
  echo "read $(python3 -c 'import json,sys;v=json.load(open(sys.argv[1]));print(v["mbit_per_s"], "Mbit/s first byte", v["first_byte_ms"], "ms open", v["open_ms"], "ms read-ahead", v["readahead_bytes"])' $OUT/read.json) reader cpu $(cat $OUT/read.cpu) target cpu $(( (T1 - T0) ))/$TCK s load $(cat /proc/loadavg)" | tee -a $OUT/info
  kill $CP; kill $TP; wait $CP $TP 2>/dev/null
  $RSV_LAB wan down --name $L
  exit 0
fi
start_ready $OUT/media.out $OUT/media.log ip netns exec $NSA env RUST_LOG=${MLOG:-info} $RSV media --listen 127.0.0.1:18080 --idle 600s ${MRATE:-} "iscsi://$B:3260/$IQN/0"
MP=$STARTED_PID
F=http://127.0.0.1:18080/media/$IQN/0/movie.mp4
cold=$(ip netns exec $NSA curl -s -o /dev/null -r 0-65535 -w '%{http_code} %{time_starttransfer}' $F)
sleep 1
warm=$(ip netns exec $NSA curl -s -o /dev/null -r $((256<<20))-$(( (256<<20) + 65535 )) -w '%{http_code} %{time_starttransfer}' $F)
sleep 1
warm2=$(ip netns exec $NSA curl -s -o /dev/null -r $((100<<20))-$(( (100<<20) + 65535 )) -w '%{http_code} %{time_starttransfer}' $F)
sleep 0.5
echo "cold $cold warm $warm warm2 $warm2 load $(cat /proc/loadavg)" | tee -a $OUT/info
kill $MP; kill $CP; kill $TP; wait $MP $CP $TP 2>/dev/null
$RSV_LAB wan down --name $L
