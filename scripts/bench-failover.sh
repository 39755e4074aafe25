#!/usr/bin/env bash
# Failover of Reservoir's initiator between two gateways, ROUNDS times: two `rsv target`
# processes export the same file LUN (portal_group 1 and 2, each the other's peer), `rsv
# load` runs verified mixed I/O through the first with the second as `?portal=`, the
# first is killed with SIGKILL one second in and started again once the load ends. Per
# round: the load's errors and mismatches (a verified read that does not find the last
# acknowledged write is a lost write) and its longest command (the stall: a command in
# flight at the kill waits for the move). Prints the stalls' p50/p99/max and the totals.
# Not a test (each round ~4 s); CI runs one kill in tests/gateway_mpath.rs.
#   scripts/bench-failover.sh [ROUNDS]     (RSV=path/to/rsv, default target/debug/rsv)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ROUNDS=${1:-10}
RSV=${RSV:-target/debug/rsv}
[ -x "$RSV" ] || { echo "no $RSV; build it (cargo build -p rsv) or set RSV" >&2; exit 2; }
IQN=iqn.2026-11.org.reservoir:failover
dir=$(mktemp -d /tmp/rsv-failover.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
pa=$(free_port)
pb=$(free_port)
gw() { # group peer port
  printf 'portal_group = %s\npeer_portal_groups = [%s]\n' "$1" "$2" > "$dir/gw$1.toml"
  target_toml "$IQN" 'store = "file:lun.img?size=64M"' >> "$dir/gw$1.toml"
  start_ready "$dir/gw$1.out" "$dir/gw$1.log" \
    "$RSV" target --listen "127.0.0.1:$3" --data-dir "$dir/data" --config "$dir/gw$1.toml"
}
gw 1 2 "$pa"
A=$STARTED_PID
gw 2 1 "$pb"
url="iscsi://127.0.0.1:$pa/$IQN/0?recovery_timeout=20&portal=127.0.0.1:$pb"
echo "load $(uptime)"
for i in $(seq "$ROUNDS"); do
  "$RSV" load "$url" --sessions 4 --connections 1 --region 4MiB --duration 3s --json \
    > "$dir/r$i.json" 2> "$dir/r$i.err" &
  lp=$!
  sleep 1
  kill -9 "$A"
  wait "$lp" || true
  wait "$A" 2>/dev/null || true
  gw 1 2 "$pa"
  A=$STARTED_PID
  python3 - "$dir/r$i.json" "$i" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"round {sys.argv[2]}: stall {r['latency_us_max']/1e6:.3f} s, {r['writes']} writes, "
      f"{r['verified_reads']} verified reads, {r['errors']} errors, {r['mismatches']} mismatches")
PY
done
python3 - "$dir" "$ROUNDS" <<'PY'
import json, sys
rs = [json.load(open(f"{sys.argv[1]}/r{i}.json")) for i in range(1, int(sys.argv[2]) + 1)]
s = sorted(r["latency_us_max"] / 1e6 for r in rs)
q = lambda p: s[min(len(s) - 1, int(round(p * (len(s) - 1))))]
err = sum(r["errors"] for r in rs)
mis = sum(r["mismatches"] for r in rs)
print(f"{len(rs)} kills: stall p50 {q(0.5):.3f} s, p99 {q(0.99):.3f} s, max {s[-1]:.3f} s; "
      f"{err} application errors, {mis} lost writes (mismatches), "
      f"{sum(r['writes'] for r in rs)} writes")
sys.exit(1 if err or mis else 0)
PY
echo "load $(uptime)"
