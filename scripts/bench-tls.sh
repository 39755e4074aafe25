#!/usr/bin/env bash
# Benchmark (not a test): what TLS costs on loopback (issue 18).
#
#   scripts/bench-tls.sh [SECONDS]      (default 10 s per measurement)
#
# Starts one `rsv target` with a RAM LUN (SPAN, default 1GiB) on two portals, plain TCP and
# TLS 1.3 (a self-signed certificate made here with openssl, pinned by the initiator), and
# measures `rsv bench` 1 MiB sequential writes, then reads (so that reads find data), QD
# per session, one connection, first in plaintext, then over TLS. For each: MB/s, and CPU
# seconds per GiB moved on each side: the target's from /proc/PID/stat, the initiator's
# (rsv bench) from its rusage. Both ends share this machine's cores, so the throughput is
# CPU-bound and says how the cores are shared; CPU/GiB says what each path costs. The load
# average before and after is printed with the table, and the rows go to OUT as JSON.
#
# Environment: RSV=path to a built rsv (else `cargo build --release --bin rsv` here, honouring
# CARGO_TARGET_DIR); SPAN; QD (default 32); OUT (default lab/bench/tls.json); SUITE (aes128,
# aes256 or chacha20: the one suite the initiator offers; default: rustls's preference).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
SPAN=${SPAN:-1GiB}
QD=${QD:-32}
OUT=${OUT:-lab/bench/tls.json}
SUITE=${SUITE:-}
. scripts/lib.sh
build_rsv

work=$(mktemp -d /tmp/rsv-tlsbench.XXXXXX)
cleanup() {
  set +e
  local pid=${STARTED_PID:-}
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && timeout 10 tail --pid="$pid" -f /dev/null
  rm -rf "$work"
}
trap cleanup EXIT

plain=127.0.0.1:$(free_port)
tls=127.0.0.1:$(free_port)
iqn=iqn.2026-11.org.reservoir:tlsbench
tls_target_toml "$work" "$plain" "$tls" "$iqn" "$SPAN" >"$work/t.toml"
pin=$PIN
start_ready "$work/t.out" "$work/t.log" "$RSV" target --config "$work/t.toml"
pid=$STARTED_PID
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# One rsv bench; prints a JSON line: MB/s and CPU seconds per GiB of target and initiator.
measure() { # rw url
  python3 - "$RSV" "$SECS" "$1" "$QD" "$pid" "$2" <<'PY'
import json, os, resource, subprocess, sys
rsv, secs, rw, qd, pid, url = sys.argv[1:7]
tick = os.sysconf("SC_CLK_TCK")
def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
t0, ru0 = cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
p = subprocess.run([rsv, "bench", "--json", "--rw", rw, "--pattern", "seq", "--block-size", "1M",
                    "--queue-depth", qd, "--connections", "1", "--duration", secs, url],
                   capture_output=True)
if p.returncode != 0:
    sys.exit(p.stderr.decode())
t1, ru1 = cpu(), resource.getrusage(resource.RUSAGE_CHILDREN)
d = json.loads(p.stdout)
gib = d["iops"] * d.get("seconds", float(secs)) / 1024
target = t1 - t0
initiator = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
print(json.dumps({"mbs": round(d["iops"] * (1 << 20) / 1e6), "gib": round(gib, 2),
                  "target_cpu_s_per_gib": round(target / gib, 3),
                  "initiator_cpu_s_per_gib": round(initiator / gib, 3)}))
PY
}

declare -A M
for rw in write read; do
  M[plain.$rw]=$(measure "$rw" "iscsi://$plain/$iqn/0")
  M[tls.$rw]=$(measure "$rw" "iscsi://$tls/$iqn/0?pin=$pin${SUITE:+&tls_suite=$SUITE}")
done
suite=$("$RSV" tune "iscsi://$tls/$iqn/0?pin=$pin${SUITE:+&tls_suite=$SUITE}" 2>/dev/null | sed -n 's/^transport: //p')
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

j() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
echo
echo "$(nproc) cores; ${SECS} s per measurement; 1 MiB sequential, QD$QD, 1 connection, ram:?size=$SPAN"
echo "TLS: $suite; load average before $load_before, after $load_after"
printf '%-14s %8s %10s %18s %18s\n' "" "MB/s" "of plain" "target CPU s/GiB" "rsv CPU s/GiB"
json="{\"seconds\": $SECS, \"nproc\": $(nproc), \"queue_depth\": $QD, \"tls\": \"$suite\", \"loadavg_before\": \"$load_before\", \"loadavg_after\": \"$load_after\""
for rw in write read; do
  for mode in plain tls; do
    m=${M[$mode.$rw]}
    ratio=$(python3 -c "print(f'{$(j "$m" mbs)/$(j "${M[plain.$rw]}" mbs):.2f}')")
    printf '%-14s %8s %10s %18s %18s\n' "$rw $mode" "$(j "$m" mbs)" "$ratio" \
      "$(j "$m" target_cpu_s_per_gib)" "$(j "$m" initiator_cpu_s_per_gib)"
    json="$json, \"$mode.$rw\": $m"
  done
done
echo "$json}" | python3 -m json.tool >"$OUT"
echo "(rows in $OUT)"
