#!/usr/bin/env bash
# Benchmark (not a test): what an initiator costs per GiB moved, two builds of `rsv bench`
# and libiscsi's tools against the same Reservoir target on loopback, alternated in one
# sitting so that the neighbours' load falls on every side alike.
#
#   scripts/bench-cost.sh [SECONDS]      (default 5 s per measurement)
#
# Rows ($ROWS, default "read:1m write:1m read:4k"), each QD32, sequential at 1 MiB and
# random at 4 KiB, one connection unless the row names a count (`read:4k:8`: `rsv bench`
# over 8 connections; the libiscsi tools, which open one, skip such rows), and after the
# count, joined by `+`, `erl0` (`rsv bench --erl 0`; it proposes 2 otherwise) and `tgt`
# (against tgt, started beside the target over a copy of its data, instead of Reservoir's
# target: `read:4k:1:erl0`, `write:4k:1:tgt`; the libiscsi tools skip `erl0` rows, which
# are theirs anyway: libiscsi proposes 0):
#   - `rsv bench` of build A ($RSV_A) and of build B ($RSV_B), alternated ROUNDS times
#     (default 3), B first in even rounds;
#   - libiscsi's iscsi-perf (reads only: it has no write mode) and `qemu-img bench` over
#     qemu's libiscsi driver (reads and writes), once per round.
# The target is $RSV (default: $RSV_A) serving a 1 GiB file in /dev/shm of random data.
#
# Each measurement gives IOPS, the initiator's CPU seconds per GiB (its rusage) and the
# target's (/proc/PID/stat); with STAT=1 also, per GiB, the initiator's system calls and
# context switches (`perf stat` on raw_syscalls:sys_enter and context-switches; the
# counting costs the side with more system calls a little, so STAT=1 runs are not
# comparable with STAT=0 ones). Per row and side: the median of the rounds and the range.
# The load average is printed before and after.
#
# Like for like, or not: iscsi-perf gives its READ16 tasks no buffer, so libiscsi gathers
# the Data-In into one of its own, which iscsi-perf frees unread; qemu-img bench
# hands libiscsi its own buffer (an iovec) for reads and writes, but adds qemu's block
# layer and coroutines. `rsv bench` reads into pooled buffers it drops unread and writes
# one buffer it made at the start.
#
# Environment: RSV_A, RSV_B (paths to rsv binaries; B optional, and may be A's path),
# RSV_A_ARGS, RSV_B_ARGS (extra `rsv bench` flags for each, e.g. "--opt recv_buffer=8MiB"),
# RSV (target), ROUNDS, ROWS, STAT, QEMU=0 (no qemu-img rows), OUT (JSON, default
# lab/bench/cost.json).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
ROUNDS=${ROUNDS:-3}
ROWS=${ROWS:-read:1m write:1m read:4k}
STAT=${STAT:-0}
OUT=${OUT:-lab/bench/cost.json}
QD=32
RSV_A=${RSV_A:?RSV_A: path to an rsv binary}
RSV_B=${RSV_B:-}
RSV=${RSV:-$RSV_A}

. scripts/bench-peers.sh
peers_work rsv-cost

head -c 1G /dev/urandom >"$work/rsv.img"
if [[ " $ROWS" == *tgt* ]]; then
  # tgt reads the same data, not holes.
  cp "$work/rsv.img" "$work/tgt.img"
else
  : >"$work/tgt.img"
  truncate -s 1G "$work/tgt.img"
fi
start_peers cost
load0=$(cut -d' ' -f1-3 /proc/loadavg)

# Runs a command measured: "initiator-cpu target-cpu wall" to $work/cpu (the target: the
# process $tpid, Reservoir's or tgt), and with STAT=1 "syscalls ctxsw" to $work/stat.
tpid=
url=
measured() { # command...
  if [ "$STAT" = 1 ]; then
    with_cpu "$tpid" perf stat -x, -o "$work/perf.txt" \
      -e raw_syscalls:sys_enter,context-switches -- "$@"
    python3 - "$work/perf.txt" >"$work/stat" <<'PY'
import sys
v = {}
for line in open(sys.argv[1]):
    f = line.strip().split(",")
    if len(f) > 2 and f[0].replace(".", "").isdigit():
        v[f[2]] = float(f[0])
print(int(v.get("raw_syscalls:sys_enter", 0)), int(v.get("context-switches", 0)))
PY
  else
    with_cpu "$tpid" "$@"
    echo "0 0" >"$work/stat"
  fi
}

# Each prints "IOPS bytes-moved" of one run; its costs are left in $work/cpu and $work/stat.
run_rsv() { # binary rw bytes connections [extra flags]
  local pat=seq
  [ "$3" = 4096 ] && pat=rand
  # shellcheck disable=SC2086
  measured timeout $((SECS + 30)) "$1" bench --json --rw "$2" --pattern "$pat" --block-size "$3" \
    --queue-depth "$QD" --connections "$4" --duration "$SECS" ${5:-} "$url" 2>"$work/err" |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(round(d["iops"]), d["ios"]*d["block_size"])' ||
    { cat "$work/err" >&2; echo 0 0; }
}
run_perf() { # rw bytes
  [ "$1" = read ] || { echo skip; return; }
  local args=(-b $(($2 / 512)) -m "$QD" -t "$SECS")
  [ "$2" = 4096 ] && args+=(-r)
  local iops
  iops=$(measured timeout $((SECS + 20)) iscsi-perf "${args[@]}" "$url" 2>&1 | tr '\r' '\n' |
    grep -o 'iops average [0-9]*' | tail -1 | grep -o '[0-9]*$' || echo 0)
  echo "$iops $((iops * SECS * $2))"
}
# qemu-img bench issues a count, not a duration: about SECS seconds at the rate of the
# round's first rsv run ($3, IOPS). It has no random pattern: at 4 KiB it strides by a
# prime number of blocks instead (-S), wrapping at the end of the LUN.
run_qemu() { # rw bytes iops-guess
  local count=$(($3 * SECS)) w=() t0 t1
  [ "$count" -lt 64 ] && count=64
  [ "$1" = write ] && w=(-w)
  local pat=()
  [ "$2" = 4096 ] && pat=(-S $((7919 * 4096)))
  t0=$(date +%s.%N)
  measured timeout $((SECS * 4 + 30)) qemu-img bench -f raw "${w[@]}" "${pat[@]}" -s "$2" -d "$QD" \
    -c "$count" "$url" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; echo 0 0; return; }
  t1=$(date +%s.%N)
  python3 -c "print(round($count/($t1-$t0)), $count*$2)"
}

size_of() { case $1 in 4k) echo 4096 ;; 1m) echo 1048576 ;; *) echo "$1" ;; esac; }

rows_json=()
declare -A RES
record() { # row side "iops bytes"
  RES[$1|$2]+="$3 $(cat "$work/cpu") $(cat "$work/stat");"
}

for r in $(seq "$ROUNDS"); do
  for row in $ROWS; do
    IFS=: read -r rw sz conns flags <<<"$row"
    bs=$(size_of "$sz") conns=${conns:-1} flags=+${flags:-}+
    url=$RSV_URL tpid=$rsv_pid erl=
    [[ $flags == *+tgt+* ]] && url=$TGT_URL tpid=$tgt_pid
    [[ $flags == *+erl0+* ]] && erl="--erl 0"
    sides=(A)
    [ -n "$RSV_B" ] && { [ $((r % 2)) = 0 ] && sides=(B A) || sides=(A B); }
    guess=0
    for s in "${sides[@]}"; do
      bin=$RSV_A extra=${RSV_A_ARGS:-}
      [ "$s" = B ] && bin=$RSV_B extra=${RSV_B_ARGS:-}
      got=$(run_rsv "$bin" "$rw" "$bs" "$conns" "$extra $erl")
      record "$row" "rsv-$s" "$got"
      [ "$guess" = 0 ] && guess=${got%% *}
    done
    [ "$conns" = 1 ] && [ -z "$erl" ] || continue
    got=$(run_perf "$rw" "$bs")
    [ "$got" != skip ] && record "$row" iscsi-perf "$got"
    [ "${QEMU:-1}" = 1 ] && { got=$(run_qemu "$rw" "$bs" "$guess"); record "$row" qemu-img "$got"; }
  done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

for k in "${!RES[@]}"; do printf '%s\t%s\n' "$k" "${RES[$k]}"; done >"$work/res"
python3 - "$SECS" "$OUT" "$load0" "$load1" "$work/res" <<'PY'
import json, statistics, sys
secs, out, load0, load1 = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
res = dict(line.rstrip("\n").split("\t") for line in open(sys.argv[5]))
size = {"4k": 4096, "1m": 1 << 20}
rows = []
print(f"{'row':10} {'initiator':11} {'IOPS':>8} {'init s/GiB':>16} {'tgt s/GiB':>16} {'sys/GiB':>9} {'cs/GiB':>8}")
for key in sorted(res, key=lambda k: (k.split('|')[0], k.split('|')[1])):
    row, side = key.split("|")
    bs = size[row.split(":")[1]]
    runs = []
    for r in res[key].strip(";").split(";"):
        iops, moved, ic, tc, wall, sc, cs = (float(x) for x in r.split())
        # CPU over the tool's whole run (login included) per GiB it moved.
        gib = moved / 2**30
        runs.append(dict(iops=iops, init=ic / gib if gib else 0, tgt=tc / gib if gib else 0,
                         sys=sc / gib if gib else 0, cs=cs / gib if gib else 0, wall=wall))
    med = lambda f: statistics.median(x[f] for x in runs)
    rng = lambda f, p: f"{min(x[f] for x in runs):.{p}f}–{max(x[f] for x in runs):.{p}f}"
    print(f"{row:10} {side:11} {med('iops'):8.0f} {med('init'):6.3f} {rng('init', 3):>9} "
          f"{med('tgt'):6.3f} {rng('tgt', 3):>9} {med('sys'):9.0f} {med('cs'):8.0f}")
    rows.append(dict(row=row, initiator=side, runs=runs))
print(f"median of {len(runs)} rounds (range); load average before {load0}, after {load1}; {secs:.0f} s a run")
json.dump(dict(seconds=secs, loadavg_before=load0, loadavg_after=load1, rows=rows),
          open(out, "w"), indent=1)
PY
