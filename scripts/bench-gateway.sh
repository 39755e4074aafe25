#!/usr/bin/env bash
# Benchmark (not a test): the cost of persistent reservations kept in the cluster
# (docs/gateway.md). Two gateways (`rsv target`, portal groups 1 and 2) export one RBD image
# of a memstore cluster (scripts/ceph-cluster.sh, started here, stopped at the end); 4 KiB
# random writes at queue depth 32 through gateway 1 by Reservoir's own initiator
# (`rsv bench --rw write`), alternately with no registration on the image and with one
# held (another initiator, libiscsi's client from crates/testkit, registers a key through
# gateway 2 and keeps it), ROUNDS rounds of each; prints each figure, the medians and
# their ratio (the goal: with >= 0.9 x without), and the load average at the start and end.
#
#   scripts/bench-gateway.sh [SECONDS] [ROUNDS]     (defaults: 10 s, 3 rounds)
#
# Environment: RSV=path to a built rsv with the `rbd` feature (else `cargo build
# --release --features rbd` here).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
SECS=${1:-10}
ROUNDS=${2:-3}
build_rsv --features rbd
rbd_work rsv-bench-gateway
load() { cut -d' ' -f1-3 /proc/loadavg; }
load_start=$(load)
rbd_bench_image "$work" 256
IQN=iqn.2026-11.org.reservoir:bench-gateway
for g in 1 2; do
  { printf 'portal_group = %s\npeer_portal_groups = [%s]\n' "$g" "$((3 - g))"
    target_toml "$IQN" "store = \"rbd:rbd/bench?conf=$CEPH_CONF\""; } >"$work/gw$g.toml"
  start_ready "$work/gw$g.out" "$work/gw$g.log" \
    "$RSV" target --listen 127.0.0.1:0 --data-dir "$work/data$g" --config "$work/gw$g.toml"
  pids+=("$STARTED_PID")
done
P1=$(portals_of "$work/gw1.out" | head -1)
P2=$(portals_of "$work/gw2.out" | head -1)
URL="iscsi://$P1/$IQN/0"
cc -O2 -o "$work/cdb" crates/testkit/src/libiscsi_cdb.c -liscsi
# The registering initiator: a coprocess that stays logged in through gateway 2.
coproc CDB { exec "$work/cdb" iqn.2026-11.org.reservoir:bench-registrant "$P2" "$IQN" 0; }
# Ended with the gateways: once they are gone its logout would retry for ever.
pids+=("$CDB_PID")
read -r ready <&"${CDB[0]}"
[ "$ready" = ready ] || { echo "libiscsi client: $ready" >&2; exit 1; }
# Not in $(...): a coprocess's descriptors are not open in subshells.
cdb() { echo "$1" >&"${CDB[1]}"; read -r ANSWER <&"${CDB[0]}"; }
# TEST UNIT READY until GOOD: the power-on unit attention, then ASYMMETRIC ACCESS STATE
# CHANGED (06h/2Ah/06h) once the gateways first see each other (implicit ALUA), and NOT
# READY while the group settles; 30 tries, half a second apart.
settle() {
  for _ in $(seq 30); do
    cdb "0 n 0 000000000000 -"
    [ "${ANSWER%% *}" = 0 ] && return 0
    sleep 0.5
  done
  echo "gateway 2 never answered TEST UNIT READY with GOOD: $ANSWER" >&2; exit 1
}
settle
KEY=000000000000abcd
# PERSISTENT RESERVE OUT, REGISTER: key, service action key, then 8 bytes of flags.
reg() { cdb "0 w 24 5f000000000000001800 ${1}${2}0000000000000000"; STATUS=${ANSWER%% *}; }
# READ KEYS: the additional length (bytes 4-7) is 0 when nothing is registered.
keys() { cdb "0 r 64 5e000000000000004000 -"; KEYS=$(echo "$ANSWER" | cut -d' ' -f5); }
rsvw() {
  timeout $((SECS + 30)) "$RSV" bench --rw write --pattern rand --block-size 4096 \
    --queue-depth 32 --duration "$SECS" --json "$URL" 2>/dev/null |
    python3 -c 'import json,sys; print(int(json.load(sys.stdin)["iops"]))'
}
without=() with=() ratios=()
# The pool's write rate drifts over a run (memstore; it fell by a third from one round to the
# next in a quiet sitting), so one unmeasured warm-up first, and the two columns alternate
# which goes first (ABBA): a drift that is linear in time falls on both alike, and each
# round's own ratio is printed beside the medians.
rsvw >/dev/null
without_round() {
  settle
  keys
  [ "$(echo "$KEYS" | cut -c9-16)" = 00000000 ] || { echo "a registration left: $KEYS" >&2; exit 1; }
  without+=("$(rsvw)")
}
with_round() {
  settle
  reg 0000000000000000 $KEY
  [ "$STATUS" = 0 ] || { echo "REGISTER failed: $ANSWER" >&2; exit 1; }
  with+=("$(rsvw)")
  reg $KEY 0000000000000000
  [ "$STATUS" = 0 ] || { echo "unregistering failed: $ANSWER" >&2; exit 1; }
}
for r in $(seq "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then without_round; with_round; else with_round; without_round; fi
  ratios+=("$(python3 -c "print(f'{${with[-1]}/${without[-1]}:.3f}')")")
  echo "round $r: without ${without[-1]} IOPS, with a registration ${with[-1]} IOPS (ratio ${ratios[-1]})"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
mw=$(median "${without[@]}") mr=$(median "${with[@]}")
echo "4 KiB random writes, QD32, through gateway 1 of 2 (memstore, ${SECS} s x $ROUNDS rounds)"
echo "  median without a registration: $mw IOPS"
echo "  median with a registration held: $mr IOPS"
echo "  ratio of the medians: $(python3 -c "print(f'{$mr/$mw:.3f}')")"
echo "  median of the rounds' ratios: $(median "${ratios[@]}")"
echo "  load average at start: $load_start, at end: $(load)"
