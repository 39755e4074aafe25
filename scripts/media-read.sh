#!/bin/bash
# One point of lab R4, several readers in one run: the 512 MiB file read start to end in
# 32 KiB calls by `rsv media --read` (each VARIANT its own options) and by `smbclient get`,
# over `rsv-lab wan` at 100 Mbit/s with DELAY ms each way and the kernel's default windows
# (CUBIC, as the lab sets). Prints one line per reader: Mbit/s, % of the link, the
# bottleneck's queue drops over the read, the reader's CPU seconds, the load average.
#
# Usage: media-read.sh OUTDIR VARIANT...   VARIANT: LABEL=ARGS, ARGS after `rsv media
#   --read ... --call-size 32K` and before the URL, `?query` appended to the URL, e.g.
#   'default=--rate 100mbit'  'c2=--rate 100mbit ?connections=2'  'smb' (smbclient get);
#   a word bin=PATH in ARGS reads with that rsv binary instead (two builds alternated over
#   one link and target: 'old=bin=/tmp/rsv-old --rate 100mbit' 'new=--rate 100mbit')
# Env: RSV (./target/release/rsv), RSV_LAB (the emulator's rsv-lab, default beside RSV),
#   DELAY (16), LINK (m3-rd: namespaces LINK-a, LINK-b),
#   SCRATCH (/dev/shm/m3-read), TARGET_SESSION (lines of the target's [session], e.g.
#   'congestion = "cubic"'), PCAP=1 (a capture of site a's side per reader, -s 120).
# Root. Everything it starts is stopped and the link taken down at the end.
set -u
RSV=${RSV:-./target/release/rsv}
RSV_LAB=${RSV_LAB:-$(dirname "$RSV")/rsv-lab}
OUT=${1:?OUTDIR}
shift
D=${SCRATCH:-/dev/shm/m3-read}
L=${LINK:-m3-rd}
DELAY=${DELAY:-16}
. "$(dirname "$0")/lib.sh"
mkdir -p "$OUT" "$D/share" "$D/smb"
media_image "$D" 512 keep
wan_up $L --rate 100mbit --delay-ab ${DELAY}ms --delay-ba ${DELAY}ms || exit 1
NSA=$(wan_get 'v["a"]["netns"]')
NSB=$(wan_get 'v["b"]["netns"]')
B=$(wan_get 'v["b"]["addr"]')
# A namespace may only choose a congestion control the host allows (as the lab does).
ALLOWED=$(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control)
case " $ALLOWED " in
  *" cubic "*) ;;
  *) echo "$ALLOWED cubic" > /proc/sys/net/ipv4/tcp_allowed_congestion_control
     trap 'echo "$ALLOWED" > /proc/sys/net/ipv4/tcp_allowed_congestion_control' EXIT ;;
esac
lab_tcp $NSA $NSB
IQN=iqn.2026-11.org.reservoir:m3-read
{
  printf '[session]\n%s\n' "${TARGET_SESSION:-}"
  target_toml "$IQN" 'alias = "home"' -- "store = \"file:$D/media.img\""
} > "$D/t.toml"
ip netns exec $NSB env RUST_LOG=warn $RSV target --listen $B:3260 --data-dir "$D/data" \
  --config "$D/t.toml" > "$OUT/target.log" 2>&1 &
TP=$!
cat > "$D/smb.conf" << S
[global]
  server role = standalone server
  map to guest = Bad User
  guest account = root
  lock directory = $D/smb
  state directory = $D/smb
  cache directory = $D/smb
  private dir = $D/smb
  pid directory = $D/smb
  log file = $D/smb/log.%m
  disable netbios = yes
  smb ports = 445
  load printers = no
  printing = bsd
  printcap name = /dev/null
[media]
  path = $D/share
  read only = yes
  guest ok = yes
  guest only = yes
S
ip netns exec $NSB smbd --foreground --debug-stdout --configfile="$D/smb.conf" > "$OUT/smbd.log" 2>&1 &
SP=$!
wait_ready "$OUT/target.log"
sleep 1
drops() { $RSV_LAB wan stats --name $L --json | python3 -c 'import json,sys;v=json.load(sys.stdin);d=v.get("ba") or v["stats"]["ba"];print(d.get("drop_queue",0))'; }
echo "delay $DELAY ms each way, 100 Mbit/s, default windows; load $(cat /proc/loadavg)" | tee "$OUT/info"
for v in "$@"; do
  label=${v%%=*}
  args=""
  [ "$label" != "$v" ] && args=${v#*=}
  q=""
  opts=()
  rbin=$RSV
  for a in $args; do
    case $a in
      \?*) q=$a ;;
      bin=*) rbin=${a#bin=} ;;
      *) opts+=("$a") ;;
    esac
  done
  if [ -n "${PCAP:-}" ]; then
    ip netns exec $NSA tcpdump -i any -s 120 -w "$OUT/$label.pcap" tcp > /dev/null 2>&1 &
    CP=$!
    sleep 0.5
  fi
  d0=$(drops)
  TIMEFORMAT='%U %S'
  if [ "$label" = smb ]; then
    { time ip netns exec $NSA timeout 200 smbclient //$B/media -N -s "$D/smb.conf" \
      -c "get movie.mp4 /dev/null" > "$OUT/$label.out" 2>&1; } 2> "$OUT/$label.cpu"
    mbit=$(grep -o 'getting file.*' "$OUT/$label.out" | sed -E 's/.*\(([0-9.]+) KiloBytes\/sec.*/\1/' |
      python3 -c 'import sys;print(round(float(sys.stdin.read())*1024*8/1e6,2))')
    extra=""
  else
    { time ip netns exec $NSA timeout 200 $rbin media --read /movie.mp4 --call-size 32K "${opts[@]}" \
      "iscsi://$B:3260/$IQN/0$q" > "$OUT/$label.json" 2> "$OUT/$label.log"; } 2> "$OUT/$label.cpu"
    mbit=$(python3 -c 'import json,sys;print(json.load(open(sys.argv[1]))["mbit_per_s"])' "$OUT/$label.json")
    extra=$(python3 -c 'import json,sys
v=json.load(open(sys.argv[1]))
print(" ".join(f"{k} {v[k]}" for k in ("connections","pacing_rate","readahead_bytes","units","skipped_units","first_byte_ms","waits","waited_s","ready_ahead_at_waits","pending_ahead_at_waits") if k in v))' "$OUT/$label.json")
  fi
  d1=$(drops)
  [ -n "${PCAP:-}" ] && { kill $CP; wait $CP 2> /dev/null; }
  pct=$(python3 -c "print(round($mbit,2))")
  echo "$label: $mbit Mbit/s ($pct % of the link) queue drops $((d1 - d0)) cpu $(cat "$OUT/$label.cpu") $extra load $(cat /proc/loadavg)" | tee -a "$OUT/info"
done
kill $TP $SP
wait $TP $SP 2> /dev/null
$RSV_LAB wan down --name $L
