#!/usr/bin/env bash
# Benchmark (not a test): Reservoir's gateway group beside tgt's, both exporting RBD images
# of one throw-away Ceph cluster (scripts/ceph-cluster.sh, memstore), in one run. Two
# `rsv target`s (portal groups 1 and 2, each the other's peer) export the image `rsvgw`;
# two tgtd processes (each its own control port and iSCSI port, tgt's rbd backing store)
# export the image `tgtgw`: the closest multi-gateway iSCSI export of one RBD image that
# runs here (LIO, tcmu-runner, ceph-iscsi and SCST need kernel modules; docs/gateway.md).
# For each pair, with the same driver (scripts/gateway-peers.py over libiscsi's C client of
# crates/testkit):
#   1. reservations across gateways: A registers and reserves WRITE EXCLUSIVE through
#      gateway 1; B, on gateway 2, reads the keys and the reservation and writes (it must
#      meet RESERVATION CONFLICT); then libiscsi's PR families with one URL per gateway,
#      and with both URLs on gateway 1 (the kind's own failures);
#   2. COMPARE AND WRITE atomicity: PER increments of a counter block from each of two
#      initiators, one per gateway, each a READ and a COMPARE AND WRITE old -> old + 1,
#      again on MISCOMPARE: the final counter against the increments acknowledged (lost
#      updates); then the same race with a plain WRITE in place of COMPARE AND WRITE,
#      which must lose some (else the count could not tell);
#   3. ALUA: INQUIRY's TPGS, REPORT and SET TARGET PORT GROUPS, then gateway 2 SIGKILLed
#      and what gateway 1 reports of it (polled 30 s), and whether it still serves a READ;
#   4. failover: `rsv load` (4 sessions, verified mixed I/O, 3 s) through gateway 1 with
#      gateway 2 as `?portal=`, gateway 1 SIGKILLed one second in and started again after:
#      the longest command (the stall), errors and mismatches (lost writes), ROUNDS times.
# Prints the table, writes everything to OUT (JSON). Exits 1 if Reservoir's pair misses
# one of its promises (a conflicting write passes, a suite test fails, an update or a write
# is lost, an application error); tgt's figures are what they are.
#
#   flock -s /tmp/bench.lock scripts/bench-gateway-peers.sh [PER] [ROUNDS]   (500 3)
#
# Environment: RSV (default target/debug/rsv, which needs the `rbd` feature), OUT (default
# lab/bench/gateway-peers.json), KINDS (default "reservoir tgt"). Needs root, Ceph
# (scripts/setup.sh), libiscsi's tools and headers, and tgt's rbd backing store, a bench-only
# package that scripts/setup.sh does not install: apt-get install tgt-rbd.
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h | --help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
. scripts/lib.sh
PER=${1:-500}
ROUNDS=${2:-3}
KINDS=${KINDS:-reservoir tgt}
RSV=${RSV:-target/debug/rsv}
OUT=${OUT:-lab/bench/gateway-peers.json}
DRIVE=(python3 scripts/gateway-peers.py)
[ -x "$RSV" ] || { echo "no $RSV; build it (cargo build -p rsv --features rbd) or set RSV" >&2; exit 2; }
# Read whole, not piped into grep -q: rsv would meet a closed pipe and fail.
case $("$RSV" version) in *"store kinds:"*rbd*) ;; *) echo "$RSV has no rbd store (build with --features rbd)" >&2; exit 2 ;; esac
[ -e /usr/lib/tgt/backing-store/bs_rbd.so ] ||
  { echo "tgt's rbd backing store is not installed (apt-get install tgt-rbd)" >&2; exit 2; }
for t in tgtd tgtadm iscsi-test-cu cc python3; do
  command -v "$t" >/dev/null || { echo "$t is not installed (scripts/setup.sh)" >&2; exit 2; }
done

rbd_work rsv-gateway-peers
# tgtd ignores SIGTERM: its processes are SIGKILLed before the shared cleanup.
declare -A PID PORT
peers_cleanup() {
  local k
  for k in "${!PID[@]}"; do
    case $k in tgt,*) kill -9 "${PID[$k]}" 2>/dev/null || true ;; esac
  done
  rbd_cleanup
}
trap peers_cleanup EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)
echo "load at start: $load_start"

scripts/ceph-cluster.sh start "$work/ceph" >/dev/null
export CEPH_CONF="$work/ceph/ceph.conf"
rbd create --size 256M rsvgw
rbd create --size 256M tgtgw
cc -O2 -o "$work/cdb" crates/testkit/src/libiscsi_cdb.c -liscsi
CDB=$work/cdb

IQN_reservoir=iqn.2026-11.org.reservoir:peers
IQN_tgt=iqn.2026-11.org.reservoir:peers-tgt
LUN_reservoir=0
LUN_tgt=1 # tgt's LUN 0 is its controller
# tgtd's control ports (it takes them up to about 32000): random, checked free below.
CPORT_BASE=$((2000 + RANDOM % 28000))
for k in reservoir,1 reservoir,2 tgt,1 tgt,2; do PORT[$k]=$(free_port); done

# Starts gateway $2 (1 or 2) of kind $1 on its port; sets PID[kind,n].
start_gw() {
  local kind=$1 n=$2 port=${PORT[$1,$2]}
  if [ "$kind" = reservoir ]; then
    { printf 'portal_group = %s\npeer_portal_groups = [%s]\n' "$n" "$((3 - n))"
      target_toml "$IQN_reservoir" "store = \"rbd:rbd/rsvgw?conf=$CEPH_CONF\""; } >"$work/rsv$n.toml"
    start_ready "$work/rsv$n.out" "$work/rsv$n.log" \
      "$RSV" target --listen "127.0.0.1:$port" --data-dir "$work/rdata$n" --config "$work/rsv$n.toml"
    PID[$kind,$n]=$STARTED_PID
    pids+=("$STARTED_PID")
  else
    local c=$((CPORT_BASE + n)) i
    # Another tgtd on this control port would take our tgtadm commands.
    if tgtadm -C "$c" --mode sys --op show >/dev/null 2>&1; then
      echo "a tgtd already answers on control port $c; run again" >&2
      exit 1
    fi
    tgtd -f --iscsi "portal=127.0.0.1:$port" -C "$c" >>"$work/tgt$n.log" 2>&1 &
    PID[$kind,$n]=$!
    for i in $(seq 100); do
      tgtadm -C "$c" --mode sys --op show >/dev/null 2>&1 && break
      kill -0 "${PID[$kind,$n]}" 2>/dev/null || { cat "$work/tgt$n.log" >&2; exit 1; }
      sleep 0.1
    done
    tgtadm -C "$c" --lld iscsi --op new --mode target --tid 1 -T "$IQN_tgt"
    tgtadm -C "$c" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 \
      --bstype rbd --backing-store rbd/tgtgw --bsopts "conf=$CEPH_CONF"
    tgtadm -C "$c" --lld iscsi --op bind --mode target --tid 1 -I ALL
  fi
}

kill_gw() {
  kill -9 "${PID[$1,$2]}" 2>/dev/null || true
  wait "${PID[$1,$2]}" 2>/dev/null || true
}

# libiscsi's reservation families, as tests/gateway_pr.rs runs them across two gateways.
FAMILIES=ALL.PrinReadKeys,ALL.PrinServiceactionRange,ALL.PrinReportCapabilities,ALL.ProutRegister,ALL.ProutReserve,ALL.ProutClear,ALL.ProutPreempt,ALL.ProutRegisterAndMove,ALL.PersistentReserveIn,ALL.PersistentReserveOut,ALL.MultipathIO

for kind in $KINDS; do
  iqn_var=IQN_$kind lun_var=LUN_$kind
  IQN=${!iqn_var} LUN=${!lun_var}
  d=$work/$kind
  mkdir -p "$d"
  uptime >"$d/load-before"
  echo "== $kind: load $(load)"
  start_gw "$kind" 1
  start_gw "$kind" 2
  P1=127.0.0.1:${PORT[$kind,1]} P2=127.0.0.1:${PORT[$kind,2]}
  active() { timeout 90 "${DRIVE[@]}" active "$CDB" "$IQN" "$LUN" 60 "$P1" "$P2"; }
  active >"$d/active0.json"

  echo "-- reservations"
  timeout 120 "${DRIVE[@]}" pr "$CDB" "$IQN" "$LUN" "$P1" "$P2" >"$d/pr.json" || true
  cat "$d/pr.json"
  # libiscsi 1.19's MultipathIO.CompareAndWrite (Debian's) zeroes LBAs 0-255 by WRITE SAME
  # and then compares LBA 256 too (upstream stopped at 255 in 2020, commit 33c66f2): it
  # passes only where LBA 256 holds zeros, so that block is zeroed before each run.
  "${DRIVE[@]}" zero "$CDB" "$IQN" "$LUN" "$P1" 256 >/dev/null
  timeout 900 iscsi-test-cu -d -S -t "$FAMILIES" "iscsi://$P1/$IQN/$LUN" "iscsi://$P2/$IQN/$LUN" \
    >"$d/suite.txt" 2>&1 || true
  "${DRIVE[@]}" suite "$d/suite.txt" >"$d/suite.json"
  cat "$d/suite.json"
  # The same families with both URLs on gateway 1: the kind's own failures, apart from
  # those of two gateways that do not share their state.
  "${DRIVE[@]}" zero "$CDB" "$IQN" "$LUN" "$P1" 256 >/dev/null
  timeout 900 iscsi-test-cu -d -S -t "$FAMILIES" "iscsi://$P1/$IQN/$LUN" "iscsi://$P1/$IQN/$LUN" \
    >"$d/suite-one.txt" 2>&1 || true
  "${DRIVE[@]}" suite "$d/suite-one.txt" >"$d/suite-one.json"
  cat "$d/suite-one.json"
  active >/dev/null

  echo "-- COMPARE AND WRITE counter race, 2 x $PER"
  timeout 1200 "${DRIVE[@]}" caw "$CDB" "$IQN" "$LUN" "$P1" "$P2" "$PER" >"$d/caw.json" || true
  cat "$d/caw.json"
  echo "-- the same race with READ + WRITE (no COMPARE AND WRITE): the count must see losses"
  timeout 1200 "${DRIVE[@]}" caw "$CDB" "$IQN" "$LUN" "$P1" "$P2" "$PER" rcw >"$d/rcw.json" || true
  cat "$d/rcw.json"

  echo "-- ALUA"
  timeout 120 "${DRIVE[@]}" alua "$CDB" "$IQN" "$LUN" "$P1" "$P2" >"$d/alua.json" || true
  cat "$d/alua.json"
  kill_gw "$kind" 2
  timeout 90 "${DRIVE[@]}" watch "$CDB" "$IQN" "$LUN" "$P1" 30 >"$d/watch.json" || true
  cat "$d/watch.json"
  start_gw "$kind" 2

  echo "-- failover, $ROUNDS kills of the gateway in use"
  url="iscsi://$P1/$IQN/$LUN?recovery_timeout=20&portal=$P2"
  for r in $(seq "$ROUNDS"); do
    active >"$d/active$r.json"
    "$RSV" load "$url" --sessions 4 --connections 1 --region 4MiB --duration 3s --json \
      >"$d/load$r.json" 2>"$d/load$r.err" &
    lp=$!
    sleep 1
    kill_gw "$kind" 1
    wait "$lp" || true
    start_gw "$kind" 1
    python3 - "$d/load$r.json" "$r" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print(f"round {sys.argv[2]}: stall {r['latency_us_max']/1e6:.3f} s, {r['writes']} writes, "
          f"{r['verified_reads']} verified reads, {r['errors']} errors, {r['mismatches']} mismatches")
except (OSError, ValueError, KeyError) as e:
    print(f"round {sys.argv[2]}: no report from rsv load ({e})")
PY
  done
  kill_gw "$kind" 1
  kill_gw "$kind" 2
  uptime >"$d/load-after"
done

python3 - "$work" "$OUT" "$KINDS" "$RSV" "$PER" "$ROUNDS" "$load_start" "$(load)" <<'PY'
import json, os, subprocess, sys, time
work, out, kinds, rsv, per, rounds, load_start, load_end = sys.argv[1:9]

def read(path, default=None):
    try:
        text = open(path).read().strip()
        return json.loads(text) if path.endswith(".json") else text
    except (OSError, ValueError):
        return default

def sh(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True).stdout.strip()
    except OSError:
        return None

result = {
    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    "command": f"scripts/bench-gateway-peers.sh {per} {rounds}",
    "commit": sh("git", "rev-parse", "--short", "HEAD"),
    "rsv": sh(rsv, "version").splitlines()[:3],
    "tgt": sh("dpkg-query", "-W", "-f", "${Version}", "tgt-rbd"),
    "ceph": sh("ceph", "--version"),
    "load_start": load_start,
    "load_end": load_end,
    "cores": os.cpu_count(),
    "kinds": {},
}
for k in kinds.split():
    d = f"{work}/{k}"
    rounds_out = []
    for i in range(1, int(rounds) + 1):
        r = read(f"{d}/load{i}.json")
        if r is None:
            rounds_out.append({"stall_s": None, "errors": None, "mismatches": None, "writes": 0,
                               "no_report": read(f"{d}/load{i}.err", "")[-500:]})
            continue
        # The initiator's own account of the failover (a warning per session that moved).
        moved = [l.strip() for l in read(f"{d}/load{i}.err", "").splitlines() if "moved from" in l]
        rounds_out.append({"stall_s": r["latency_us_max"] / 1e6, "errors": r["errors"],
                           "mismatches": r["mismatches"], "writes": r["writes"],
                           "verified_reads": r["verified_reads"],
                           "first_errors": r["first_errors"][:5],
                           "sessions_moved": len(moved), "first_move": moved[0][-160:] if moved else None})
    result["kinds"][k] = {
        "load_before": read(f"{d}/load-before"),
        "load_after": read(f"{d}/load-after"),
        "pr": read(f"{d}/pr.json"),
        "pr_suite": read(f"{d}/suite.json"),
        "pr_suite_one_gateway": read(f"{d}/suite-one.json"),
        "caw": read(f"{d}/caw.json"),
        "rcw": read(f"{d}/rcw.json"),
        "alua": read(f"{d}/alua.json"),
        "alua_after_kill": read(f"{d}/watch.json"),
        "failover": {"rounds": rounds_out},
    }
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
json.dump(result, open(out, "w"), indent=1)
print(f"written: {out}")
PY
"${DRIVE[@]}" report "$OUT"
echo "load at start: $load_start, at end: $(load)"

# Reservoir's promises, checked on its pair (tgt's figures are figures; `gateway-peers.py
# check OUT tgt` shows the same check failing on the pair that breaks them).
case " $KINDS " in *" reservoir "*) "${DRIVE[@]}" check "$OUT" reservoir ;; esac
