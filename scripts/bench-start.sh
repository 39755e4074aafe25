#!/bin/bash
# Where a whole copy's wall clock goes across R0 (100 ms, 100 Mbit/s, 1 % loss): `rsv cp`
# of SIZE random bytes to a RAM LUN, as a user types it (no --rate, no path cache), timed
# from outside, with the phases `rsv cp --json` reports (.phases: connect, copy, flush,
# logout) and its per-second progress (when the link first ran near full). Builds are
# alternated run by run: OLD and NEW (paths of rsv binaries), RUNS runs each. Needs root.
#   RSV_LAB=... scripts/bench-start.sh OLD NEW [RUNS] [SIZE_MIB] [LOSS]
# RATE=20mbit (default 100mbit) and RTT=... (default 100ms) give another path: a slow one,
# to check that a start does not hurt it.
# Prints one line per run and the medians per build; the payload capacity it compares
# with is 100 Mbit/s x 1448/1500 (TCP/IP headers; iSCSI's 48-byte headers per 256 KiB are
# left out). Docs: docs/bench-start.md.
set -u
OLD=$1; NEW=$2; RUNS=${3:-3}; MIB=${4:-128}; LOSS=${5:-1%}
RATE=${RATE:-100mbit}; RTT=${RTT:-100ms}
RSV_LAB=${RSV_LAB:-$(dirname "$NEW")/rsv-lab}
N=${RSV_LAB_PREFIX:-}bstart
D=${OUT:-/tmp/bench-start}
rm -rf "$D"; mkdir -p "$D"
. "$(dirname "$0")/lib.sh"
wan_up "$N" --rtt "$RTT" --rate "$RATE" --loss "$LOSS" || exit 1
echo "path: $RTT, $RATE, loss $LOSS, ${MIB} MiB"
RATE_BPS=$(python3 -c '
import re, sys
m = re.fullmatch(r"([0-9.]+)\s*([kmg]?)bit", sys.argv[1].lower())
print(int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]))' "$RATE")
A=$(wan_get "v['a']['netns']"); B=$(wan_get "v['b']['netns']"); BA=$(wan_get "v['b']['addr']")
cleanup() { [ -n "${TP:-}" ] && kill "$TP" 2>/dev/null; wait 2>/dev/null; $RSV_LAB wan down --name "$N" >/dev/null 2>&1; }
trap cleanup EXIT
head -c "$((MIB << 20))" /dev/urandom > "$D/src.img"
IQN=iqn.2026-11.org.reservoir:start
target_toml "$IQN" "store = \"ram:?size=$((MIB + 16))MiB\"" > "$D/target.toml"
echo "load at start: $(cat /proc/loadavg)"
for i in $(seq "$RUNS"); do
  for which in old new; do
    if [ $which = old ]; then BIN=$OLD; else BIN=$NEW; fi
    # Each run its own target of the same build: both ends run what that build defaults to.
    start_ready "$D/target-$which-$i.log" "$D/target-$which-$i.log" ip netns exec "$B" \
      env RUST_LOG=info "$BIN" target --listen "$BA:3260" --data-dir "$D/data" --config "$D/target.toml" || exit 1
    TP=$STARTED_PID
    t0=$(date +%s.%N)
    ip netns exec "$A" env RUST_LOG=info RSV_PATH_CACHE=off "$BIN" cp "$D/src.img" \
      "iscsi://$BA:3260/$IQN/0" --json --progress json > "$D/cp-$which-$i.json" 2> "$D/cp-$which-$i.err"
    rc=$?
    t1=$(date +%s.%N)
    kill "$TP"; wait "$TP" 2>/dev/null; TP=
    echo "$which $i $rc $t0 $t1 $(cut -d' ' -f1 /proc/loadavg)" >> "$D/runs.txt"
  done
done
echo "load at end: $(cat /proc/loadavg)"
python3 - "$D" "$MIB" "$RATE_BPS" <<'P'
import json, sys, statistics
d, mib, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
cap = rate * 1448 / 1500           # payload bits/s of the link
ideal = mib * 2**20 * 8 / cap
rows = {}
for line in open(d + '/runs.txt'):
    which, i, rc, t0, t1, load = line.split()
    wall = float(t1) - float(t0)
    r = {'wall': wall, 'load': float(load), 'rc': int(rc)}
    try:
        v = json.load(open(f'{d}/cp-{which}-{i}.json'))
        p = v.get('phases', {})
        r.update(copy=v['seconds'], connect=p.get('connect_s'), flush=p.get('flush_s'),
                 logout=p.get('logout_s'),
                 cc=(v['sessions'][0].get('congestion_by_connection') or ['?'])[0],
                 found=v['sessions'][0].get('start_found_by_connection'))
    except Exception as e:
        r['error'] = str(e)
    # The first second of progress at 90 % of the payload capacity or more.
    full = None
    prev = (0.0, 0)
    first = []                     # Mbit/s of the first three progress intervals
    for l in open(f'{d}/cp-{which}-{i}.err'):
        if l.startswith('{"bytes"'):
            p = json.loads(l)
            s, b = p['seconds'], p['bytes']
            if s > prev[0] and len(first) < 3:
                first.append((b - prev[1]) * 8 / (s - prev[0]) / 1e6)
            if full is None and s > prev[0] and (b - prev[1]) * 8 / (s - prev[0]) >= 0.9 * cap:
                full = prev[0]
            prev = (s, b)
    r['full_after'] = full
    r['first'] = first
    r['pct'] = 100 * ideal / wall
    rows.setdefault(which, []).append(r)
    f = lambda x: '-' if x is None else f'{x:.2f}'
    print(f"{which} run {i}: wall {wall:.2f} s = {r['pct']:.1f} % of capacity; connect {f(r.get('connect'))}, "
          f"copy {f(r.get('copy'))} (flush {f(r.get('flush'))}, link 90 % full after {f(full)}), "
          f"logout {f(r.get('logout'))}, rest (process start and exit) "
          f"{f(wall - sum(r.get(k) or 0 for k in ('connect', 'copy', 'logout')))}; cc {r.get('cc')}; "
          f"first seconds {', '.join(f'{x:.0f}' for x in first)} Mbit/s; "
          f"probed start found {r.get('found') if r.get('found') is not None else '-'} B/s; load {load}")
print(f'ideal at the payload capacity: {ideal:.2f} s')
for which, rs in rows.items():
    med = lambda k: statistics.median([r[k] for r in rs if r.get(k) is not None] or [float('nan')])
    print(f"{which}: median wall {med('wall'):.2f} s ({100 * ideal / med('wall'):.1f} %), connect {med('connect'):.2f}, "
          f"copy {med('copy'):.2f}, flush {med('flush'):.3f}, logout {med('logout'):.3f}, runs {len(rs)}")
P
