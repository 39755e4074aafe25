#!/usr/bin/env bash
# `rsv sync` of sparse and compressible volumes over an emulated long path (rsv-lab wan):
# for each volume, a first full sync onto a far LUN that holds old data everywhere, once
# without compression (the baseline, same run) and once as `rsv sync` decides (--compress
# auto). Prints, per volume: its size (what a sync sent before: every unit), what it holds
# (units with a non-zero byte, counted here from the image), what each sync sent as data
# and on the wire, and the times, and the CPU seconds of each process per GiB of data sent
# (the source's `rsv target`, the far one, the emulator's relay, the coordinator); writes
# the figures as JSON.
# Needs root, iproute2, mkfs.ext4 and loop devices.
#   usage: scripts/bench-sync-sparse.sh [RTT] [RATE] [SIZE_MIB]   (350ms 300mbit 256)
#   env: RSV, RSV_LAB (default target/debug/...; the dev profile is optimized),
#        OUT (default lab/bench/sync-sparse.json)
set -euo pipefail
cd "$(dirname "$0")/.."
RTT=${1:-350ms}
RATE=${2:-300mbit}
SIZE=${3:-256}
RSV=$(realpath "${RSV:-target/debug/rsv}")
LAB=$(realpath "${RSV_LAB:-target/debug/rsv-lab}")
OUT=${OUT:-lab/bench/sync-sparse.json}
REPO=$(pwd)
NAME=rsvsps
IQN=iqn.2026-11.org.reservoir:sparse
WORK=$(mktemp -d /dev/shm/rsv-sps.XXXXXX)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    mountpoint -q "$WORK/mnt" && umount "$WORK/mnt"
    "$LAB" wan down --name $NAME >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
LOAD_BEFORE=$(cut -d' ' -f1 /proc/loadavg)

# The volumes, each SIZE MiB: an ext4 file system holding source trees, one filled with
# programs (a VM's root disk, full), half random data and half never written.
mkdir -p "$WORK/mnt"
ext4() { # image, then directories to copy until full
    local img=$1; shift
    truncate -s "${SIZE}M" "$img"
    mkfs.ext4 -q -F "$img"
    mount -o loop "$img" "$WORK/mnt"
    for d in "$@"; do cp -a "$d" "$WORK/mnt/" 2>/dev/null || true; done
    umount "$WORK/mnt"
}
ext4 "$WORK/a-src.img" /usr/include "$REPO/crates" "$REPO/docs" "$REPO/lab/src" "$REPO/tests"
ext4 "$WORK/a-vm.img" /usr/bin /usr/lib/x86_64-linux-gnu
truncate -s "${SIZE}M" "$WORK/a-rand.img"
head -c $((SIZE / 2))M /dev/urandom | dd of="$WORK/a-rand.img" conv=notrunc status=none
VOLS=(src vm rand)
old_data() { # the far LUN holds old data everywhere
    head -c "${SIZE}M" /dev/zero | tr '\0' '\245' >"$WORK/b-$1.img"
}
for v in "${VOLS[@]}"; do old_data "$v"; done

"$LAB" wan up --name $NAME --rtt "$RTT" --rate "$RATE" --json >"$WORK/link.json"
A=$(python3 -c "import json; print(json.load(open('$WORK/link.json'))['a']['addr'])")
B=$(python3 -c "import json; print(json.load(open('$WORK/link.json'))['b']['addr'])")
for ns in $NAME-a $NAME-b; do
    ip netns exec $ns sysctl -qw net.ipv4.tcp_rmem="4096 131072 268435456" net.ipv4.tcp_wmem="4096 16384 268435456"
done
. scripts/lib.sh
site_key "$WORK/key"
target() { # side, address
    local cfg="$WORK/$1.toml" i=0
    {
        site_toml "$2" "$WORK" "$WORK/key" "$IQN"
        for v in "${VOLS[@]}"; do
            printf '[[target.lun]]\nid = %d\nstore = "file:%s"\n' $i "$WORK/$1-$v.img"
            i=$((i + 1))
        done
    } >"$cfg"
    site_target $NAME-$1 "$cfg" "$WORK/$1"
    PIDS+=("$STARTED_PID")
}
target a "$A"
target b "$B"

held() { # bytes in 1 MiB units with a non-zero byte
    python3 - "$1" <<'PY'
import sys
z = bytes(1 << 20); n = 0
with open(sys.argv[1], 'rb') as f:
    while (b := f.read(1 << 20)):
        n += len(b) if b != z[:len(b)] else 0
print(n)
PY
}
# The relay of this link (others' links may run beside it).
RELAY=$(pgrep -f "wan relay --name $NAME( |\$)" | head -1)
[ -n "$RELAY" ] || { echo "the link's relay not found"; exit 1; }
cpu_of() { # pid -> user+system seconds of the process (its ended threads included)
    python3 -c "import os,sys; f=open(f'/proc/{sys.argv[1]}/stat').read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))" "$1"
}
sync() { # lun, compress mode -> the done line, then a line of CPU seconds: source far relay sync
    local c0a c0b c0r
    c0a=$(cpu_of "${PIDS[0]}") c0b=$(cpu_of "${PIDS[1]}") c0r=$(cpu_of "$RELAY")
    ip netns exec $NAME-a /usr/bin/time -f "%U %S" -o "$WORK/sync.time" \
        "$RSV" sync --key-file "$WORK/key" --json --rate "$RATE" --compress "$2" \
        "$A/$IQN/$1" "$B/$IQN/$1" | tail -1
    python3 -c 'import sys; a=[float(x) for x in sys.argv[1:7]]; u,s=open(sys.argv[7]).read().split()[-2:]; print(a[3]-a[0], a[4]-a[1], a[5]-a[2], float(u)+float(s))' \
        "$c0a" "$c0b" "$c0r" "$(cpu_of "${PIDS[0]}")" "$(cpu_of "${PIDS[1]}")" "$(cpu_of "$RELAY")" "$WORK/sync.time"
}
ROWS="$WORK/rows.jsonl"
: >"$ROWS"
i=0
for v in "${VOLS[@]}"; do
    H=$(held "$WORK/a-$v.img")
    for mode in off auto; do
        old_data "$v"
        LOAD=$(cut -d' ' -f1 /proc/loadavg)
        sync $i $mode >"$WORK/sync.out"
        head -1 "$WORK/sync.out" >"$WORK/done.json"
        cmp -s "$WORK/a-$v.img" "$WORK/b-$v.img" || { echo "$v ($mode): the far image differs"; exit 1; }
        python3 - "$v" "$mode" "$H" "$((SIZE << 20))" "$WORK/done.json" "$(tail -1 "$WORK/sync.out")" "$LOAD" >>"$ROWS" <<'PY'
import json, sys
v, mode, held, size, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
cpu = dict(zip(("source", "far", "relay", "sync"), (float(x) for x in sys.argv[6].split())))
d = json.load(open(path))
print(json.dumps({"volume": v, "compress": mode, "size": size, "held": held,
    "data_bytes": d["data_bytes"], "wire_bytes": d["wire_bytes"], "zero_bytes": d["zero_bytes"],
    "compressed_units": d["compressed_units"], "seconds": d["seconds"], "verified_units": d["verified_units"],
    "load_before": float(sys.argv[7]), "cpu_s": cpu}))
PY
    done
    i=$((i + 1))
done
python3 - "$ROWS" "$OUT" "$RTT" "$RATE" "$SIZE" "$LOAD_BEFORE" <<'PY'
import json, sys, time, os
rows = [json.loads(l) for l in open(sys.argv[1])]
out, rtt, rate, size, load = sys.argv[2:7]
M = 1 << 20
print(f"link {rtt} {rate}, volumes of {size} MiB; first syncs onto old data; baseline: --compress off in this run")
print(f"{'volume':7} {'held MiB':>9} {'before MiB':>10} {'data MiB':>9} {'data/held':>9} {'wire MiB':>9} {'ratio':>6} {'off s':>7} {'auto s':>7} {'speed-up':>8}")
summary = []
for v in dict.fromkeys(r["volume"] for r in rows):
    off = next(r for r in rows if r["volume"] == v and r["compress"] == "off")
    auto = next(r for r in rows if r["volume"] == v and r["compress"] == "auto")
    s = {"volume": v, "held": off["held"], "before": off["size"], "data": auto["data_bytes"],
         "data_over_held": auto["data_bytes"] / max(off["held"], 1),
         "wire": auto["wire_bytes"], "ratio": auto["data_bytes"] / max(auto["wire_bytes"], 1),
         "seconds_off": off["seconds"], "seconds_auto": auto["seconds"],
         "speedup": off["seconds"] / auto["seconds"]}
    summary.append(s)
    print(f"{v:7} {s['held']/M:9.1f} {s['before']/M:10.1f} {s['data']/M:9.1f} {s['data_over_held']:9.3f} "
          f"{s['wire']/M:9.1f} {s['ratio']:6.2f} {s['seconds_off']:7.2f} {s['seconds_auto']:7.2f} {s['speedup']:8.2f}")
json.dump({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rtt": rtt, "rate": rate,
           "size_mib": int(size), "load_before": float(load), "cpus": os.cpu_count(),
           "summary": summary, "runs": rows}, open(out, "w"), indent=1)
print("CPU seconds per GiB of data sent (source rsv target, far rsv target, relay, coordinator), load at the start")
for r in rows:
    g = max(r["data_bytes"], 1) / (1 << 30)
    c = r["cpu_s"]
    print(f"{r['volume']:7} {r['compress']:5} source {c['source']/g:6.2f} far {c['far']/g:6.2f} relay {c['relay']/g:6.2f} "
          f"sync {c['sync']/g:5.2f}  ({r['seconds']:.2f} s, load {r['load_before']})")
print(f"written {out}")
PY
