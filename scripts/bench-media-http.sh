#!/bin/bash
# `rsv media`'s HTTP on loopback: one large GET (curl to /dev/null) of a file on an ext4
# LUN of `rsv target` (file store on tmpfs), its rate and the media server's CPU seconds
# per GiB (utime + stime from /proc). Prints one line per round and the median.
# Usage: bench-media-http.sh [ROUNDS]   ($RSV, default ./target/release/rsv; SIZE= the
# file in MiB, default 1024; READAHEAD= the media server's --readahead, default 16M: on
# loopback RTT × rate is a single unit, and each unit's round trip would set the pace;
# SCRATCH= the tmpfs directory, to keep people's runs apart).
# Run under `flock -x /tmp/bench.lock` so that nothing builds meanwhile.
set -eu
RSV=${RSV:-./target/release/rsv}
ROUNDS=${1:-5}
SIZE=${SIZE:-1024}
D=${SCRATCH:-/dev/shm/bench-media-http}
IQN=iqn.2026-11.org.reservoir:bench-media
. "$(dirname "$0")/lib.sh"
mkdir -p "$D/data"
media_image "$D" "$SIZE"
{
  printf 'portals = ["127.0.0.1:0"]\ndata_dir = "%s"\n' "$D/data"
  target_toml "$IQN" 'alias = "home"' -- "store = \"file:$D/media.img\""
} > "$D/t.toml"
# Starts "$@" with stdout to $1.out; waits for `ready`; prints the address of its first
# `listening`/`portal` line.
start() {
  local name=$1
  shift
  start_ready "$D/$name.out" "$D/$name.log" "$@"
  echo "$STARTED_PID" > "$D/$name.pid"
  grep -m1 -E '^(listening|portal) ' "$D/$name.out" | cut -d' ' -f2
}
stop() { kill "$(cat "$D/target.pid")" "$(cat "$D/media.pid")" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop EXIT
PORTAL=$(start target env RUST_LOG=warn "$RSV" target --config "$D/t.toml")
MEDIA=$(start media env RUST_LOG=warn "$RSV" media --listen 127.0.0.1:0 --idle 600s \
  --readahead "${READAHEAD:-16M}" \
  "iscsi://$PORTAL/$IQN/0")
MP=$(cat "$D/media.pid")
# Storage given by URL is named by its IQN.
URL=http://$MEDIA/media/$IQN/0/movie.mp4
TCK=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# A first GET logs in and warms the page cache of the image; not counted.
curl -sf -o /dev/null "$URL"
for r in $(seq "$ROUNDS"); do
  C0=$(cpu "$MP")
  OUT=$(curl -sf -o /dev/null -w '%{size_download} %{time_total}' "$URL")
  C1=$(cpu "$MP")
  python3 -c '
import sys
b, t, c, tck = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
gib = b / 2**30
print(f"round {sys.argv[5]}: {b} bytes in {t:.2f} s: {b / t / 1e6:.0f} MB/s; media server CPU {c / tck / gib:.3f} s/GiB")
' $OUT $((C1 - C0)) "$TCK" "$r"
done | tee "$D/rounds"
python3 - "$D/rounds" <<'P'
import re, statistics, sys
rows = [re.findall(r"([\d.]+) MB/s; media server CPU ([\d.]+)", l)[0] for l in open(sys.argv[1])]
print(f"median of {len(rows)}: {statistics.median(float(r[0]) for r in rows):.0f} MB/s, "
      f"{statistics.median(float(r[1]) for r in rows):.3f} CPU s/GiB (media server); "
      f"load average {open('/proc/loadavg').read().split()[0]}")
P
