#!/usr/bin/env bash
# Benchmark (not a test): what a sync costs in CPU per GiB moved, source and far disk
# servers apart. Runs R2's default row (`rsv-lab run r2 --rows reservoir --rtt 350
# --link-rate 800mbit --seconds SECONDS`: a volume striped over 8 disk servers per site,
# random data, synced over the emulated 350 ms / 800 Mbit/s link onto fresh far LUNs)
# ROUNDS times and, for each run, samples /proc (scripts/proc-cpu-sample.py): CPU seconds
# (user, system) and minor page faults of the source disk servers, the far ones and the
# relay; the bytes the far disk servers pass to pwrite (perf's syscall tracepoint, with
# PWRITE=1) against the volume. Prints CPU-s per GiB of the volume per role; CPU per GiB
# holds under load far better than the throughput does, but a loaded machine inflates
# it too: record the load printed beside every figure.
#
#   scripts/bench-sync-cpu.sh LAB_BINARY TAG [SECONDS] [ROUNDS]   (default 20 s, 1 round)
#
# LAB_BINARY is an `rsv-lab` with its `rsv` beside it (e.g. a release build:
# CARGO_TARGET_DIR=/tmp/rel cargo build --release -p rsv -p rsv-lab, then
# /tmp/rel/release/rsv-lab), or an `rsv` of a build from before the bench had its own
# binary (`rsv lab run r2`). Results: /tmp/sync-cpu/TAG-N.json (and the lab's own under
# /tmp/sync-cpu/TAG-N/). Figures: docs/bench-sync-cpu.md. Run as root, alone if you can:
#   flock -x /tmp/bench.lock scripts/bench-sync-cpu.sh /tmp/rel/release/rsv-lab after 20 3
set -euo pipefail
cd "$(dirname "$0")/.."
lab=${1:?LAB_BINARY}
tag=${2:?TAG}
secs=${3:-20}
rounds=${4:-1}
out=/tmp/sync-cpu
mkdir -p "$out"
case "$(basename "$lab")" in
    rsv) run=("$lab" lab run r2) ;;
    *) run=("$lab" run r2) ;;
esac
pw=()
[ "${PWRITE:-0}" = 1 ] && pw=(--pwrite)
for n in $(seq 1 "$rounds"); do
    json="$out/$tag-$n.json"
    python3 scripts/proc-cpu-sample.py "${pw[@]}" --json "$json" -- \
        "${run[@]}" --link-rate 800mbit --rows reservoir --rtt 350 --seconds "$secs" \
        --out "$out/$tag-$n" --no-doc >"$out/$tag-$n.log" 2>&1 || true
    grep -E '^r2: 350' "$out/$tag-$n.log" | cut -c1-160 || echo "run $n: no R2 row (see $out/$tag-$n.log)"
    python3 - "$json" "$out/$tag-$n/r2.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
try:
    gib = json.load(open(sys.argv[2]))["volume_bytes"] / 2**30
except (OSError, KeyError, ValueError):
    sys.exit(f"no volume size in {sys.argv[2]}")
r = s["roles"]
def cpu(k):
    x = r.get(k, {})
    return x.get("user_s", 0) + x.get("sys_s", 0)
src, far = cpu("a-disk"), cpu("b-disk")
print(f"  volume {gib:.2f} GiB; load {' '.join(s['load_before'])} -> {' '.join(s['load_after'])}")
print(f"  CPU-s/GiB: source {src / gib:.2f}  far {far / gib:.2f}  both {(src + far) / gib:.2f}  "
      f"relay {cpu('relay') / gib:.2f}")
for k in ("a-disk", "b-disk"):
    x = r.get(k, {})
    print(f"  {k}: user {x.get('user_s', 0):.2f} s sys {x.get('sys_s', 0):.2f} s, "
          f"minor faults {x.get('minflt', 0) / gib:.0f}/GiB, pwrite {x.get('pwrite_bytes', 0) / 2**30:.2f} GiB "
          f"in {x.get('pwrite_calls', 0)} calls")
EOF
done
