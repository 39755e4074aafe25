#!/usr/bin/env bash
# Failover of the active gateway on a real Ceph cluster with a persistent reservation held
# (issue 40). Two `rsv target` gateways (portal groups 1 and 2, each the other's peer)
# export one RBD image of a throw-away memstore cluster (scripts/ceph-cluster.sh, started
# here, stopped at the end). The application, Reservoir's initiator, writes through the
# first with the second as `?portal=`, its sessions registered with a key and holding
# WRITE EXCLUSIVE - REGISTRANTS ONLY (`?pr_key=...&pr_type=we_ro`):
#   load   `rsv load` (4 sessions, verified mixed I/O: a read that does not find the last
#          acknowledged write is a lost write)
#   crash  `rsv crash --url` (8 writers of stamped units, FUA and SYNCHRONIZE CACHE; the
#          region read back and judged at the end: a durable write missing is a loss)
# KILLS times: the gateway the sessions are on is killed with SIGKILL; once the sessions
# have moved (their log says so), a second initiator (libiscsi's client,
# crates/testkit/src/libiscsi_cdb.c) logs in through the surviving gateway: its WRITE must
# meet RESERVATION CONFLICT and its READ RESERVATION must show the owner's key and type;
# then the killed gateway is started again on its port, and the next kill waits until
# both report every group active/optimized. At the end the writer is stopped (SIGTERM)
# and reports. Prints each kill, the stalls' p50/p99/max (a kill's stall: the longest
# write or read answered after it and before the next, from the writer's `slow_commands`,
# 50 ms and up; a kill with none is counted as 0.05 s, an upper bound), the application's
# errors, lost writes, the reservation checks passed and failed, and the load average at
# the start and end; writes the JSON result to OUT; exits 1 on any violation.
#
#   scripts/bench-failover-rbd.sh [KILLS] [load|crash]      (defaults: 100, load)
#
# Environment: RSV (an rsv built with the rbd feature; default target/debug/rsv), OUT
# (default lab/bench/failover-rbd.json, lab/bench/failover-rbd-crash.json for crash),
# GAP (seconds of writing before each kill, default 1).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
KILLS=${1:-100}
WRITER=${2:-load}
GAP=${GAP:-1}
case $WRITER in
load) SESSIONS=4 ;;
crash) SESSIONS=1 ;;
*) echo "the writer is load or crash, not $WRITER" >&2; exit 2 ;;
esac
RSV=${RSV:-target/debug/rsv}
[ -x "$RSV" ] || { echo "no $RSV; build it (cargo build -p rsv --features rbd) or set RSV" >&2; exit 2; }
# grep reading to the end: with -q it would leave at the first match, and rsv's SIGPIPE
# would fail the pipeline.
"$RSV" version 2>/dev/null | grep -w rbd >/dev/null ||
  { echo "$RSV has no rbd store; build it with --features rbd" >&2; exit 2; }
if [ "$WRITER" = crash ]; then OUT=${OUT:-lab/bench/failover-rbd-crash.json}; else OUT=${OUT:-lab/bench/failover-rbd.json}; fi
have() { command -v "$1" >/dev/null; }
for t in ceph-mon ceph-osd rbd cc python3; do have "$t" || { echo "missing: $t" >&2; exit 2; }; done
KEY=0x5e55101100000040
IQN=iqn.2026-11.org.reservoir:failover-rbd
load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)
echo "load average at the start: $load_start"

rbd_work rsv-failover-rbd
scripts/ceph-cluster.sh start "$work/ceph" >/dev/null
export CEPH_CONF="$work/ceph/ceph.conf"
rbd create --size 256M failover
cc -O2 -o "$work/cdb" crates/testkit/src/libiscsi_cdb.c -liscsi
P=("" "127.0.0.1:$(free_port)" "127.0.0.1:$(free_port)")
GW=("" "" "")
starts=0
gw() { # N: gateway N (portal group N) on its port, again after a kill
  local n=$1 i
  { printf 'portal_group = %s\npeer_portal_groups = [%s]\n' "$n" "$((3 - n))"
    target_toml "$IQN" "store = \"rbd:rbd/failover?conf=$CEPH_CONF\""; } >"$work/gw$n.toml"
  # The port of a process just killed may take a moment to be free again.
  for i in $(seq 50); do
    starts=$((starts + 1))
    if start_ready "$work/gw$n.$starts.out" "$work/gw$n.$starts.log" "$RSV" target \
      --listen "${P[$n]}" --data-dir "$work/data$n" --config "$work/gw$n.toml" 2>/dev/null; then
      GW[$n]=$STARTED_PID
      pids+=("$STARTED_PID")
      return 0
    fi
    sleep 0.2
  done
  echo "gateway $n did not start on ${P[$n]}; its log:" >&2
  cat "$work/gw$n.$starts.log" >&2
  return 1
}
# The second initiator: one login through portal $1, the request lines on stdin (see
# libiscsi_cdb.c), the answers on stdout after its "ready".
other() { "$work/cdb" "iqn.2026-11.org.reservoir:${2:-intruder}" "$1" "$IQN" 0 2>/dev/null; }
TUR="0 n 0 000000000000 -"
# Every gateway reports every target port group active/optimized (REPORT TARGET PORT
# GROUPS through each).
all_active() {
  local p a
  for p in "${P[1]}" "${P[2]}"; do
    a=$(printf '%s\n%s\n%s\n' "$TUR" "$TUR" "0 r 1024 a30a00000000000004000000 -" |
      other "$p" watcher | tail -1) || return 1
    python3 - "$a" <<'PY' || return 1
import sys
f = sys.argv[1].split()
if len(f) != 5 or f[0] != "0" or f[4] == "-":
    sys.exit(1)
d = bytes.fromhex(f[4])
at, ok = 4, len(d) > 4
while at + 8 <= len(d):
    ok &= d[at] & 0x0F == 0
    at += 8 + 4 * d[at + 7]
sys.exit(0 if ok else 1)
PY
  done
}
wait_active() {
  local i
  for i in $(seq 300); do
    all_active && return 0
    sleep 0.1
  done
  echo "the gateways did not all report active/optimized within 30 s" >&2
  return 1
}
gw 1
gw 2
wait_active
# The LUN's block length, for the other initiator's one-block WRITE (10) at 128 MiB.
BL=$(printf '%s\n%s\n%s\n' "$TUR" "$TUR" "0 r 8 25000000000000000000 -" | other "${P[1]}" |
  tail -1 | python3 -c 'import sys; print(int(sys.stdin.read().split()[4][8:16], 16))')
LBA=$(printf '%08x' $((128 * 1024 * 1024 / BL)))
BLOCK=$(head -c "$BL" /dev/zero | tr '\0' '\356' | od -An -tx1 -v | tr -d ' \n')
checks_ok=0 checks_failed=0 failures=()
# Through portal $1: the other initiator's WRITE meets RESERVATION CONFLICT (status 24),
# its READ RESERVATION shows KEY with type 5. $2 says when, for the failures' list.
check() {
  local out why
  out=$(printf '%s\n%s\n%s\n%s\n%s\n' "$TUR" "$TUR" "$TUR" \
    "0 w $BL 2a00${LBA}00000100 $BLOCK" "0 r 64 5e010000000000004000 -" | other "$1" | tail -2)
  why=$(python3 - "$out" "$KEY" <<'PY'
import sys
lines = sys.argv[1].splitlines()
key = int(sys.argv[2], 16)
bad = []
if len(lines) != 2:
    print("the other initiator got no answers: " + sys.argv[1]); sys.exit()
w, r = lines[0].split(), lines[1].split()
if w[0] != "24":
    bad.append(f"its WRITE answered {' '.join(w[:4])}, not RESERVATION CONFLICT")
if len(r) != 5 or r[0] != "0" or r[4] == "-":
    bad.append(f"READ RESERVATION answered {' '.join(r[:4])}")
else:
    d = bytes.fromhex(r[4])
    if len(d) < 22 or int.from_bytes(d[4:8], "big") < 16:
        bad.append("READ RESERVATION shows no reservation")
    elif int.from_bytes(d[8:16], "big") != key or d[21] & 0x0F != 5:
        bad.append(f"READ RESERVATION shows key {d[8:16].hex()} type {d[21] & 0x0F}")
print("; ".join(bad))
PY
)
  if [ -z "$why" ]; then
    checks_ok=$((checks_ok + 1))
  else
    checks_failed=$((checks_failed + 1))
    failures+=("$2 through $1: $why")
    echo "  reservation check failed $2 through $1: $why" >&2
  fi
}

URL="iscsi://${P[1]}/$IQN/0?recovery_timeout=30&portal=${P[2]}&pr_key=$KEY&pr_type=we_ro"
case $WRITER in
load) RUST_LOG=info "$RSV" load "$URL" --sessions 4 --connections 1 --region 4MiB \
  --duration 86400s --slow 50ms --json >"$work/writer.json" 2>"$work/writer.err" & ;;
crash) RUST_LOG=info "$RSV" crash --url "$URL" --writers 8 --size 32MiB --duration 86400s \
  --slow 50ms --json >"$work/writer.json" 2>"$work/writer.err" & ;;
esac
writer=$!
pids+=("$writer")
# Until the reservation is there (the writer logged in and took it).
for i in $(seq 300); do
  r=$(printf '%s\n%s\n%s\n' "$TUR" "$TUR" "0 r 64 5e010000000000004000 -" | other "${P[1]}" | tail -1)
  case $(echo "$r" | cut -d' ' -f5) in *"${KEY#0x}"*) break ;; esac
  kill -0 "$writer" 2>/dev/null || { echo "the writer ended:" >&2; cat "$work/writer.err" >&2; exit 1; }
  sleep 0.1
done
check "${P[1]}" "before the kills"
check "${P[2]}" "before the kills"
moved() { grep -c 'multipath: session to .* moved from' "$work/writer.err" || true; }
on=1
: >"$work/kills"
for k in $(seq "$KILLS"); do
  sleep "$GAP"
  kill -0 "$writer" 2>/dev/null || { failures+=("the writer ended before kill $k"); break; }
  survivor=$((3 - on))
  before=$(moved)
  date +%s.%N >>"$work/kills"
  kill -9 "${GW[$on]}"
  wait "${GW[$on]}" 2>/dev/null || true
  # Every session moved to the survivor (each logs its move once it is through).
  for i in $(seq 600); do
    [ "$(moved)" -ge $((before + SESSIONS)) ] && break
    sleep 0.05
  done
  if [ "$(moved)" -lt $((before + SESSIONS)) ]; then
    failures+=("kill $k: $((before + SESSIONS - $(moved))) session(s) not moved within 30 s")
    echo "  kill $k: not every session moved within 30 s" >&2
  fi
  check "${P[$survivor]}" "after kill $k"
  gw "$on"
  wait_active
  echo "kill $k: gateway $on (${P[$on]}) killed, the sessions on gateway $survivor, reservation checks $checks_ok passed, $checks_failed failed"
  on=$survivor
done
sleep "$GAP"
kill -TERM "$writer"
wait "$writer" || true
load_end=$(load)
python3 - "$work" "$OUT" "$WRITER" "$KILLS" "$checks_ok" "$checks_failed" "$load_start" "$load_end" \
  "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates tests scripts || echo -dirty)" \
  "$RSV" "$(moved)" "$SESSIONS" "${failures[@]+"${failures[@]}"}" <<'PY'
import datetime, json, sys
work, out, writer, kills_n, ok, failed, load_start, load_end, build, rsv, moves, sessions = sys.argv[1:13]
failures = sys.argv[13:]
kills = [float(l) for l in open(f"{work}/kills")]
try:
    r = json.load(open(f"{work}/writer.json"))
except Exception as e:
    print(f"no report from the writer ({e}):\n" + open(f"{work}/writer.err").read()[-4000:])
    sys.exit(1)
slow = r.get("slow_commands", [])
stalls = []
for i, t in enumerate(kills):
    until = kills[i + 1] if i + 1 < len(kills) else float("inf")
    # Each slow command counts for the last kill before its answer: the one it waited
    # on (a command issued before a kill and answered after the next would otherwise
    # count for both).
    s = [c["seconds"] for c in slow
         if t <= c["start_unix_s"] + c["seconds"] < until]
    stalls.append(max(s) if s else 0.05)
ss = sorted(stalls) or [0.0]
q = lambda p: ss[min(len(ss) - 1, int(round(p * (len(ss) - 1))))]
if writer == "load":
    errors, lost, phantoms, ops = r["errors"], r["mismatches"], 0, r["ios"]
    first = r.get("first_errors", [])
else:
    errors, lost, phantoms, ops = r["errors"], r["losses"], r["phantoms"], r["writes_acknowledged"]
    first = r.get("findings", [])
moves, sessions, ok, failed = int(moves), int(sessions), int(ok), int(failed)
violations = list(failures)
if errors: violations.append(f"{errors} application errors")
if lost: violations.append(f"{lost} lost writes")
if phantoms: violations.append(f"{phantoms} phantom units")
if failed: violations.append(f"{failed} reservation checks failed")
if moves != sessions * len(kills):
    violations.append(f"{moves} moves logged, not {sessions * len(kills)}")
result = {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "build": build, "rsv": rsv, "writer": writer, "sessions": sessions,
    "load_average_start": load_start, "load_average_end": load_end,
    "kills": len(kills), "kills_asked": int(kills_n),
    "stall_s": {"p50": q(0.5), "p99": q(0.99), "max": ss[-1]},
    "stalls_s": stalls,
    "application_errors": errors, "lost_writes": lost, "phantoms": phantoms,
    "operations": ops, "moves_logged": moves,
    "reservation_checks_passed": ok, "reservation_checks_failed": failed,
    "violations": violations, "writer_first_errors": first[:10],
}
with open(out, "w") as f:
    json.dump(result, f, indent=2)
    f.write("\n")
print(f"{len(kills)} kills ({writer}): stall p50 {q(0.5):.3f} s, p99 {q(0.99):.3f} s, "
      f"max {ss[-1]:.3f} s; {errors} application errors, {lost} lost writes"
      + (f", {phantoms} phantoms" if writer == "crash" else "")
      + f"; reservation checks {ok} passed, {failed} failed; {moves} moves; {ops} operations")
print(f"load average at the start: {load_start}, at the end: {load_end}; result in {out}")
for v in violations:
    print(f"VIOLATION: {v}")
sys.exit(1 if violations else 0)
PY
