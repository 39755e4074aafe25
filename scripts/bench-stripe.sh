#!/usr/bin/env bash
# Benchmark (not a test): a volume striped over four disk servers on loopback (issue 17),
# against what its members give alone.
#
#   scripts/bench-stripe.sh [SECONDS]      (default 10 s per measurement)
#
# Starts four disk-server `rsv target`s, each serving one RAM LUN (SPAN bytes, default
# 256MiB), and a file-server `rsv target --stripe` over their iscsi:// LUNs, then measures
# with `rsv bench` 1 MiB sequential writes and reads (writes first, so that reads hit
# data, not the zero pages of chunks never written), QD per session:
#
#   alone       each disk server by itself (one rsv bench on one member at a time)
#   concurrent  all four disk servers at once (four rsv bench, one per member): the
#               machine's ceiling with every member busy
#   stripe      the file server's striped LUN (one rsv bench at 4 x QD over 4 connections,
#               as much in flight as the four members together), once per unit in UNITS
#               (default "1M 256K": a 1 MiB command on one member, or spanning four)
#
# and prints MB/s, stripe / sum of members alone, stripe / concurrent sum, and CPU seconds
# per GiB moved: the CPU of every rsv process (disk servers, file server, rsv bench) over
# the measurement, from /proc/PID/stat and the bench's rusage. On a machine with few cores
# the throughput ratios say mostly how the cores are shared; CPU/GiB says what each path
# costs. The load average before and after is printed with the table.
#
# Environment: RSV=path to a built rsv (else `cargo build --release -p rsv` here, honouring
# CARGO_TARGET_DIR); SPAN; QD (default 32); UNITS; OUT (default lab/bench/stripe.json).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECS=${1:-10}
SPAN=${SPAN:-256MiB}
QD=${QD:-32}
UNITS=${UNITS:-1M 256K}
OUT=${OUT:-lab/bench/stripe.json}
if [ -z "${RSV:-}" ]; then
  cargo build --release -p rsv >/dev/null
  RSV=${CARGO_TARGET_DIR:-$PWD/target}/release/rsv
fi

work=$(mktemp -d /tmp/rsv-sbench.XXXXXX)
pids=()
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do timeout 10 tail --pid="$p" -f /dev/null || kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

# Starts `rsv target ARGS...` on a free port; prints its pid and portal once it is ready.
start_target() { # name args...
  local name=$1 port
  shift
  port=$(free_port)
  start_ready "$work/$name.out" "$work/$name.log" \
    "$RSV" target --listen "127.0.0.1:$port" --data-dir "$work/$name" "$@" || exit 1
  echo "$STARTED_PID 127.0.0.1:$port"
}

members=()
for i in 0 1 2 3; do
  target_toml "iqn.2026-11.org.reservoir:ds$i" "store = \"ram:?size=$SPAN\"" >"$work/ds$i.toml"
  read -r pid portal <<<"$(start_target "ds$i" --config "$work/ds$i.toml")"
  pids+=("$pid")
  members+=("iscsi://$portal/iqn.2026-11.org.reservoir:ds$i/0")
done
ds_pids="${pids[*]}"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

# Runs one rsv bench per URL, all at once, and prints a JSON line: each bench's bytes per
# second, their sum, and the CPU seconds of every rsv process (those named in PIDS and the
# benches) per GiB moved.
measure() { # rw queue-depth connections pids url...
  python3 - "$RSV" "$SECS" "$1" "$2" "$3" "$4" "${@:5}" <<'PY'
import json, os, resource, subprocess, sys, time
rsv, secs, rw, qd, conns, pids, urls = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6].split(), sys.argv[7:]
tick = os.sysconf("SC_CLK_TCK")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick
before = {p: cpu(p) for p in pids}
ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
t0 = time.monotonic()
procs = [subprocess.Popen([rsv, "bench", "--json", "--rw", rw, "--pattern", "seq",
                           "--block-size", "1M", "--queue-depth", qd, "--connections", conns,
                           "--duration", secs, u], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
         for u in urls]
outs = [p.communicate() for p in procs]
wall = time.monotonic() - t0
ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
server_cpu = sum(cpu(p) - before[p] for p in pids)
bench_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
rates, moved = [], 0
for (out, err), p in zip(outs, procs):
    if p.returncode != 0:
        sys.stderr.write(err.decode())
        rates.append(0)
        continue
    d = json.loads(out)
    rate = d["iops"] * (1 << 20)
    rates.append(rate)
    moved += rate * d.get("seconds", float(secs))
gib = moved / (1 << 30)
print(json.dumps({"mbs": [round(r / 1e6) for r in rates], "sum_mbs": round(sum(rates) / 1e6),
                  "server_cpu_s": round(server_cpu, 2), "bench_cpu_s": round(bench_cpu, 2),
                  "cpu_s_per_gib": round((server_cpu + bench_cpu) / gib, 3) if gib else None,
                  "wall_s": round(wall, 2)}))
PY
}

declare -A M
for rw in write read; do
  for i in 0 1 2 3; do
    M[alone.$rw.$i]=$(measure "$rw" "$QD" 1 "$ds_pids" "${members[$i]}")
  done
  M[conc.$rw]=$(measure "$rw" "$QD" 1 "$ds_pids" "${members[@]}")
done
for unit in $UNITS; do
  read -r fs_pid fs_portal <<<"$(start_target "fs-$unit" --stripe "$(IFS=,; echo "${members[*]}")" --stripe-unit "$unit")"
  pids+=("$fs_pid")
  "$RSV" target --stripe "$(IFS=,; echo "${members[*]}")" --stripe-unit "$unit" --check | tail -5 >"$work/layout-$unit"
  for rw in write read; do
    M[stripe.$unit.$rw]=$(measure "$rw" $((4 * QD)) 4 "$ds_pids $fs_pid" "iscsi://$fs_portal/iqn.2026-11.org.reservoir:target0/0")
  done
  kill "$fs_pid"
  timeout 10 tail --pid="$fs_pid" -f /dev/null || true
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

j() { python3 -c "import json,sys; d=json.loads(sys.argv[1]); print(d[sys.argv[2]])" "$1" "$2"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}' if $2 else 'n/a')"; }
echo
echo "rsv $("$RSV" --version 2>/dev/null | head -1); $(nproc) cores; ${SECS} s per measurement; 1 MiB sequential, QD$QD per member"
echo "members: 4 disk servers, ram:?size=$SPAN each; load average before $load_before, after $load_after"
printf '%-34s %10s %10s %14s %14s %10s\n' "" "MB/s" "" "" "" "CPU s/GiB"
json="{\"seconds\": $SECS, \"nproc\": $(nproc), \"span\": \"$SPAN\", \"queue_depth\": $QD, \"loadavg_before\": \"$load_before\", \"loadavg_after\": \"$load_after\""
for rw in write read; do
  alone_sum=0
  for i in 0 1 2 3; do
    m=${M[alone.$rw.$i]}
    alone_sum=$((alone_sum + $(j "$m" sum_mbs)))
    printf '%-34s %10s %10s %14s %14s %10s\n' "$rw: disk server $i alone" "$(j "$m" sum_mbs)" "" "" "" "$(j "$m" cpu_s_per_gib)"
  done
  printf '%-34s %10s\n' "$rw: sum of the four alone" "$alone_sum"
  c=${M[conc.$rw]}
  conc=$(j "$c" sum_mbs)
  printf '%-34s %10s %10s %14s %14s %10s\n' "$rw: all four at once (sum)" "$conc" "$(j "$c" mbs | tr -d ' ')" "" "" "$(j "$c" cpu_s_per_gib)"
  printf '%-34s %10s %10s %14s %14s %10s\n' "" "" "" "÷ sum alone" "÷ concurrent" ""
  json+=", \"$rw\": {\"alone_mbs\": [$(for i in 0 1 2 3; do j "${M[alone.$rw.$i]}" sum_mbs; done | paste -sd,)], \"alone_sum_mbs\": $alone_sum, \"concurrent\": $c"
  for unit in $UNITS; do
    s=${M[stripe.$unit.$rw]}
    v=$(j "$s" sum_mbs)
    printf '%-34s %10s %10s %14s %14s %10s\n' "$rw: stripe, unit $unit" "$v" "" "$(ratio "$v" "$alone_sum")" "$(ratio "$v" "$conc")" "$(j "$s" cpu_s_per_gib)"
    json+=", \"stripe_$unit\": $s"
  done
  json+="}"
done
echo
echo "layout (rsv target --stripe ... --check):"
cat "$work/layout-${UNITS%% *}"
echo "$json}" >"$OUT"
