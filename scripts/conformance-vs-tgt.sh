#!/usr/bin/env bash
# libiscsi's iscsi-test-cu (-d -S: data loss and SANITIZE allowed) against Reservoir and
# against tgt, each with the multipath URL pair, and the passed/failed/skipped counts of
# both. A test that passes after printing [SKIPPED] counts as skipped.
#
# FAMILIES (default "ALL", which holds every test once; Sanitize.Reset is left out) picks
# the -t runs; each family runs in its own iscsi-test-cu process, because a second pass in
# one process through Sanitize.BlockEraseReserved spins forever inside iscsi-test-cu (its
# PDU hook ends up calling itself), whatever the target.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
FAMILIES=${FAMILIES:-ALL}
RSV=${RSV:-target/debug/rsv}
[ -x "$RSV" ] || cargo build -p rsv
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

tally() {
  python3 - "$1" "$2" <<'PY'
import re, sys
res = {}
suite = cur = None
for line in open(sys.argv[2], errors="replace"):
    m = re.match(r"^Suite: (\S+)", line)
    if m:
        suite = m.group(1); continue
    m = re.match(r"^\s+Test: (\S+) \.\.\.(.*)", line)
    if m:
        cur, body = suite + "." + m.group(1), m.group(2)
        r = body.strip()
        if r.startswith("passed") or r.startswith("FAILED"):
            res[cur] = "failed" if r.startswith("FAILED") else "passed"; cur = None
        continue
    if cur is None:
        continue
    if line.startswith("passed") or line.startswith("FAILED"):
        r = "failed" if line.startswith("FAILED") else ("skipped" if "[SKIPPED]" in body else "passed")
        if res.get(cur) != "failed":
            res[cur] = r
        cur = None
    else:
        body += line
n = {k: sorted(t for t, v in res.items() if v == k) for k in ("passed", "failed", "skipped")}
print(f"{sys.argv[1]}: {len(res)} tests, passed {len(n['passed'])}, failed {len(n['failed'])}, skipped {len(n['skipped'])}")
print("  failed: " + " ".join(n["failed"]))
print("  skipped: " + " ".join(n["skipped"]))
PY
}

# ALL but Sanitize.Reset, for both targets: it needs a SANITIZE OVERWRITE that lasts
# seconds (tests/conformance.rs says more); tgt, without OVERWRITE, skips it anyway.
iscsi-test-cu -l 2>&1 | python3 -c '
import sys
names = [l.strip() for l in sys.stdin]
for n in names:
    if n.count(".") == 1 and n.startswith("ALL.") and n != "ALL.Sanitize":
        print(n)
    elif n.startswith("ALL.Sanitize.") and n != "ALL.Sanitize.Reset":
        print(n)
' > "$work/all.txt"

run_suite() { # name url1 url2
  : > "$work/$1.txt"
  for f in $FAMILIES; do
    [ "$f" = ALL ] && f="$work/all.txt"
    timeout 1800 iscsi-test-cu -d -S -t "$f" "$2" "$3" >> "$work/$1.txt" 2>&1 || true
  done
  tally "$1" "$work/$1.txt"
}

# Reservoir: thin removable file LUN, two portals, ACL naming the suite's initiators.
iqn=iqn.2026-11.org.reservoir:conformance
{
  printf 'data_dir = "%s"\n' "$work/data"
  suite_target_toml "$iqn" lun0.img
} > "$work/rsv.toml"
start_ready "$work/rsv.out" "$work/rsv.log" \
  "$RSV" target --listen 127.0.0.1:0 --listen 127.0.0.1:0 --config "$work/rsv.toml"
mapfile -t ps < <(portals_of "$work/rsv.out")
run_suite Reservoir "iscsi://${ps[0]}/$iqn/0" "iscsi://${ps[1]}/$iqn/0"

# tgt: a 64 MiB sparse file LUN (LUN 1; LUN 0 is tgt's controller), one portal.
tp=$(free_port); ctl=$((1000 + tp % 30000))
tgtd -f --iscsi "portal=127.0.0.1:$tp" -C "$ctl" > "$work/tgtd.log" 2>&1 &
adm() { tgtadm -C "$ctl" --lld iscsi "$@"; }
until adm --op show --mode target > /dev/null 2>&1; do sleep 0.1; done
truncate -s 64M "$work/tgt.img"
tiqn=iqn.2026-11.org.reservoir:tgt
adm --op new --mode target --tid 1 -T "$tiqn"
adm --op new --mode logicalunit --tid 1 --lun 1 -b "$work/tgt.img"
adm --op bind --mode target --tid 1 -I ALL
run_suite tgt "iscsi://127.0.0.1:$tp/$tiqn/1" "iscsi://127.0.0.1:$tp/$tiqn/1"
