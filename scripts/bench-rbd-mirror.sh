#!/usr/bin/env bash
# Ceph's rbd-mirror (snapshot mode) against `rsv sync` across the same emulated long path
# (rsv-lab wan), in the same run: two Ceph clusters, one per site (site A's behind the link),
# rbd-mirror at site B pulling A's image; two `rsv target`s with file LUNs and `rsv sync`
# between them. For each: a first sync of a volume holding SIZE MiB of random data, then an
# incremental one after CHANGE MiB were rewritten; for rbd-mirror also the failback after a
# forced promotion (both sides written: its resync). Each figure is the wall time and the
# bytes that crossed the link (the site interfaces' counters), and the link's use.
# Needs root, iproute2, Ceph (scripts/setup.sh) and rbd-mirror (apt-get install rbd-mirror).
#   usage: scripts/bench-rbd-mirror.sh [RTT] [RATE] [SIZE_MIB] [CHANGE_MIB]   (350ms 300mbit 256 32)
#   env: RSV, RSV_LAB (default target/debug/...), OUT (default lab/bench/rbd-mirror.json)
set -euo pipefail
cd "$(dirname "$0")/.."
RTT=${1:-350ms}
RATE=${2:-300mbit}
SIZE=${3:-256}
CHANGE=${4:-32}
RSV=$(realpath "${RSV:-target/debug/rsv}")
LAB=$(realpath "${RSV_LAB:-target/debug/rsv-lab}")
OUT=${OUT:-lab/bench/rbd-mirror.json}
CEPH=$(realpath scripts/ceph-cluster.sh)
command -v rbd-mirror >/dev/null || { echo "rbd-mirror is not installed (apt-get install rbd-mirror)"; exit 2; }
NAME=rsvrbm
IQN=iqn.2026-11.org.reservoir:mirror
WORK=$(mktemp -d /tmp/rsv-rbm.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    for c in ca cb; do [ -e "$WORK/$c/ceph.conf" ] && "$CEPH" stop "$WORK/$c" >/dev/null 2>&1; done
    "$LAB" wan down --name $NAME >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)

"$LAB" wan up --name $NAME --rtt "$RTT" --rate "$RATE" --json >"$WORK/link.json"
A=$(python3 -c "import json; print(json.load(open('$WORK/link.json'))['a']['addr'])")
B=$(python3 -c "import json; print(json.load(open('$WORK/link.json'))['b']['addr'])")
for ns in $NAME-a $NAME-b; do
    ip netns exec $ns ip link set lo up
    # The same socket buffers for both: enough for a bandwidth-delay product of 800 Mbit/s
    # at 350 ms.
    ip netns exec $ns sysctl -qw net.ipv4.tcp_rmem="4096 131072 268435456" net.ipv4.tcp_wmem="4096 16384 268435456"
done
ina() { ip netns exec $NAME-a "$@"; }
inb() { ip netns exec $NAME-b "$@"; }
# Bytes sent out of site A (all interfaces but loopback): what crossed the link towards B.
tx_a() { ina awk 'NR > 2 && $1 != "lo:" { s += $10 } END { print s }' /proc/net/dev; }
# TCP segments site A retransmitted so far.
retrans_a() { ina awk '/^Tcp:/ { if (n++) print $13 }' /proc/net/snmp; }
now() { date +%s.%N; }

# --- Ceph: a cluster per site, rbd-mirror at B pulling from A. ---
ina env CEPH_ADDR="$A" "$CEPH" start "$WORK/ca" >/dev/null
inb env CEPH_ADDR="$B" "$CEPH" start "$WORK/cb" >/dev/null
RA=(rbd -c "$WORK/ca/ceph.conf")
RB=(rbd -c "$WORK/cb/ceph.conf")
ina "${RA[@]}" mirror pool enable rbd image
inb "${RB[@]}" mirror pool enable rbd image
ina "${RA[@]}" mirror pool peer bootstrap create --site-name a rbd >"$WORK/token"
# Two-way, as a site that means to fail back sets it up: a daemon at each site, the one at
# the primary's site idle until its image is demoted. The pool replayer reads the local
# cluster's configuration from CEPH_CONF.
inb "${RB[@]}" mirror pool peer bootstrap import --site-name b --direction rx-tx rbd "$WORK/token"
ip netns exec $NAME-a env CEPH_CONF="$WORK/ca/ceph.conf" rbd-mirror -c "$WORK/ca/ceph.conf" --id admin \
    --log-file "$WORK/ca/log/rbd-mirror.log" --debug-rbd-mirror "${RBM_DEBUG:-0}" -f >"$WORK/ca/log/rbd-mirror.out" 2>&1 &
PIDS+=($!)
ip netns exec $NAME-b env CEPH_CONF="$WORK/cb/ceph.conf" rbd-mirror -c "$WORK/cb/ceph.conf" --id admin \
    --log-file "$WORK/cb/log/rbd-mirror.log" -f >"$WORK/cb/log/rbd-mirror.out" 2>&1 &
PIDS+=($!)
sleep 5

head -c "${SIZE}M" /dev/urandom >"$WORK/vol.img"
head -c "${CHANGE}M" /dev/urandom >"$WORK/change.img"
ina "${RA[@]}" import --no-progress --image-feature layering,exclusive-lock "$WORK/vol.img" vol

# Waits until the copy of `vol` at site $2 (a or b; b unless given) has a non-primary
# mirror snapshot marked copied for the primary's snapshot id $1 or later.
copied() {
    local want=$1 side=${2:-b} i conf
    conf="$WORK/c$side/ceph.conf"
    for ((i = 0; i < 6000; i++)); do
        if ip netns exec $NAME-$side rbd -c "$conf" snap ls --all vol 2>/dev/null |
            python3 -c "
import re, sys
want = int(sys.argv[1])
for l in sys.stdin:
    m = re.search(r':(\d+) copied', l)
    if m and int(m.group(1)) >= want:
        sys.exit(0)
sys.exit(1)" "$want"; then return 0; fi
        sleep 0.2
    done
    echo "rbd-mirror: snapshot $want not copied in 20 min"; exit 1
}
# The id of the newest primary mirror snapshot at site $1 (a unless given).
last_snap() {
    ip netns exec $NAME-${1:-a} rbd -c "$WORK/c${1:-a}/ceph.conf" snap ls --all vol |
        awk '/mirror \(primary/ { id = $1 } END { print id }'
}
ROWS="$WORK/rows.jsonl"
: >"$ROWS"
row() { # tool, phase, seconds, bytes, retransmitted segments
    echo "{\"tool\": \"$1\", \"phase\": \"$2\", \"seconds\": $3, \"wire_bytes\": $4, \"retransmits\": ${5:-null}}" >>"$ROWS"
    echo "$1 $2: $3 s, $4 bytes across the link, ${5:-?} segments retransmitted"
}
x0=$(tx_a); r0=$(retrans_a); t0=$(now)
ina "${RA[@]}" mirror image enable vol snapshot >/dev/null
copied "$(last_snap)"
t1=$(now); x1=$(tx_a); r1=$(retrans_a)
row rbd-mirror first "$(echo "$t1 - $t0" | bc)" $((x1 - x0)) $((r1 - r0))
cmp <(ina "${RA[@]}" export --no-progress vol -) <(inb "${RB[@]}" export --no-progress vol -) ||
    { echo "rbd-mirror: B's image differs after the first sync"; exit 1; }

# CHANGE MiB rewritten at the start of the image, then the next mirror snapshot.
qemu_write() { # namespace, cluster, pattern, offset in MiB
    ip netns exec "$1" qemu-io -f raw -c "write -q -P $3 $4M ${CHANGE}M" \
        "rbd:rbd/vol:conf=$WORK/$2/ceph.conf:id=admin"
}
qemu_write $NAME-a ca 0xa5 0
x0=$(tx_a); r0=$(retrans_a); t0=$(now)
ina "${RA[@]}" mirror image snapshot vol >/dev/null
copied "$(last_snap)"
t1=$(now); x1=$(tx_a); r1=$(retrans_a)
row rbd-mirror incremental "$(echo "$t1 - $t0" | bc)" $((x1 - x0)) $((r1 - r0))

# Failback after a disaster: B promoted by force while A was still primary (A's site lost),
# B written, A back and demoted. Both sides were written after their last common snapshot,
# which rbd-mirror calls split-brain: A's image must be resynced from B, by the daemon at
# site A.
inb "${RB[@]}" mirror image promote --force vol >/dev/null
# B's change in another region than A's last one, with other bytes.
qemu_write $NAME-b cb 0x5a "$CHANGE"
inb "${RB[@]}" mirror image snapshot vol >/dev/null
ina "${RA[@]}" mirror image demote vol >/dev/null
tx_b() { inb awk 'NR > 2 && $1 != "lo:" { s += $10 } END { print s }' /proc/net/dev; }
retrans_b() { inb awk '/^Tcp:/ { if (n++) print $13 }' /proc/net/snmp; }
x0=$(tx_b); r0=$(retrans_b); t0=$(now)
ina "${RA[@]}" mirror image resync vol >/dev/null
copied "$(last_snap b)" a
t1=$(now); x1=$(tx_b); r1=$(retrans_b)
row rbd-mirror failback "$(echo "$t1 - $t0" | bc)" $((x1 - x0)) $((r1 - r0))
cmp <(ina "${RA[@]}" export --no-progress vol -) <(inb "${RB[@]}" export --no-progress vol -) ||
    { echo "rbd-mirror: A's image differs from B's after the resync"; exit 1; }

# --- rsv sync: the same volume and the same change, file LUNs at each site. ---
. scripts/lib.sh
site_key "$WORK/key"
cp "$WORK/vol.img" "$WORK/a.img"
truncate -s "${SIZE}M" "$WORK/b.img"
target() { # side, address
    local cfg="$WORK/$1.toml"
    {
        site_toml "$2" "$WORK" "$WORK/key" "$IQN"
        printf '[[target.lun]]\nid = 0\nstore = "file:%s"\ntrack = true\n' "$WORK/$1.img"
    } >"$cfg"
    site_target $NAME-$1 "$cfg" "$WORK/$1"
    PIDS+=("$STARTED_PID")
}
target a "$A"
target b "$B"
sync_once() {
    ina "$RSV" sync --key-file "$WORK/key" --json --compress off "$A/$IQN/0" "$B/$IQN/0" | tail -1 >"$WORK/done.json"
}
x0=$(tx_a); r0=$(retrans_a); t0=$(now)
sync_once
t1=$(now); x1=$(tx_a); r1=$(retrans_a)
row rsv-sync first "$(echo "$t1 - $t0" | bc)" $((x1 - x0)) $((r1 - r0))
ina "$RSV" cp --no-progress "$WORK/change.img" "iscsi://$A:3260/$IQN/0" >/dev/null 2>&1
x0=$(tx_a); r0=$(retrans_a); t0=$(now)
sync_once
t1=$(now); x1=$(tx_a); r1=$(retrans_a)
row rsv-sync incremental "$(echo "$t1 - $t0" | bc)" $((x1 - x0)) $((r1 - r0))
cmp "$WORK/a.img" "$WORK/b.img" || { echo "rsv sync: the far image differs"; exit 1; }

python3 - "$ROWS" "$OUT" "$RTT" "$RATE" "$SIZE" "$CHANGE" "$LOAD_BEFORE" <<'PY'
import json, os, re, sys, time
rows = [json.loads(l) for l in open(sys.argv[1])]
out, rtt, rate, size, change, load = sys.argv[2:8]
m = re.fullmatch(r'(\d+)([kmg])bit', rate)
link = int(m.group(1)) * {'k': 1e3, 'm': 1e6, 'g': 1e9}[m.group(2)] if m else None
M = 1 << 20
print(f"link {rtt} {rate}; volume {size} MiB of random data, then {change} MiB rewritten")
print(f"{'tool':11} {'phase':12} {'seconds':>8} {'wire MiB':>9} {'retransmits':>11} {'payload Mbit/s':>15} {'of link':>8}")
for r in rows:
    # What had to move: the volume on a first sync, the change on an incremental; on the
    # failback the units that differ (B's change; A was not written after its demotion).
    payload = (int(size) if r['phase'] == 'first' else int(change)) * M
    r['payload_bytes'] = payload
    r['payload_mbit_s'] = payload * 8 / r['seconds'] / 1e6
    r['of_link'] = payload * 8 / r['seconds'] / link if link else None
    print(f"{r['tool']:11} {r['phase']:12} {r['seconds']:8.2f} {r['wire_bytes']/M:9.1f} {r['retransmits']:11} "
          f"{r['payload_mbit_s']:15.1f} {r['of_link']:8.3f}")
json.dump({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rtt": rtt, "rate": rate,
           "size_mib": int(size), "change_mib": int(change), "load_before": float(load),
           "load_after": float(open('/proc/loadavg').read().split()[0]), "cpus": os.cpu_count(),
           "rows": rows}, open(out, "w"), indent=1)
print(f"written {out}")
PY
