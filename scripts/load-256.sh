#!/usr/bin/env bash
# 256 concurrent sessions against one `rsv target` for SECONDS (default 600): 192 from
# Reservoir's initiator (`rsv load`: 2 connections each, verified mixed I/O in regions of
# their own) and 64 from libiscsi's iscsi-perf (random 4 KiB reads). Prints rsv load's
# report (errors, mismatches, p50/p99/p99.9 latency, the target's peak RSS and fds, RSS a
# quarter in and at the end) and the iscsi-perf sessions that failed. Not a test: long.
#   scripts/load-256.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECONDS_=${1:-600}
RSV=${RSV:-target/release/rsv}
[ -x "$RSV" ] || cargo build --release -p rsv
dir=$(mktemp -d /tmp/rsv-load.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true' EXIT
target_toml iqn.2026-11.org.reservoir:load 'store = "file:lun.img?size=256M"' > "$dir/target.toml"
start_ready "$dir/target.out" "$dir/target.log" \
  "$RSV" target --listen 127.0.0.1:0 --data-dir "$dir/data" --config "$dir/target.toml" || true
tpid=$STARTED_PID
portal=$(portals_of "$dir/target.out" | head -1)
url="iscsi://$portal/iqn.2026-11.org.reservoir:load/0"
for i in $(seq 64); do
  timeout --signal=INT "$SECONDS_" iscsi-perf -i "iqn.2026-11.org.reservoir:perf$i" -m 4 -b 8 -r "$url" \
    > "$dir/perf$i.log" 2>&1 &
done
"$RSV" load "$url" --sessions 192 --connections 2 --region 1MiB --duration "${SECONDS_}s" \
  --target-pid "$tpid" --json | tee "$dir/load.json"
wait_perf_failed=0
for i in $(seq 64); do
  if grep -qiE 'fail|error' "$dir/perf$i.log"; then
    wait_perf_failed=$((wait_perf_failed + 1))
    echo "iscsi-perf $i:"; tail -3 "$dir/perf$i.log"
  fi
done
echo "iscsi-perf sessions with errors: $wait_perf_failed of 64; logs in $dir"
