#!/usr/bin/env python3
"""The measuring half of scripts/bench-gateway-peers.sh: what two gateways of one kind
answer, driven through libiscsi's C client of crates/testkit (libiscsi_cdb.c, built by the
script), one process per initiator, each logged in to its own gateway. The script starts
and kills the gateways; this program only sends commands and judges the answers, the
same way for every kind of gateway, so that a row of the table is one code path.

    gateway-peers.py pr    CDB IQN LUN PORTAL1 PORTAL2           reservations across gateways
    gateway-peers.py caw   CDB IQN LUN PORTAL1 PORTAL2 N [rcw]   the counter race, N a side
    gateway-peers.py alua  CDB IQN LUN PORTAL1 PORTAL2           RTPG, STPG, INQUIRY's TPGS
    gateway-peers.py watch CDB IQN LUN PORTAL SECONDS             RTPG polled after a kill
    gateway-peers.py active CDB IQN LUN SECONDS PORTAL...         waits until all are AO
    gateway-peers.py zero  CDB IQN LUN PORTAL LBA                 zeros one block
    gateway-peers.py suite LOG                                    iscsi-test-cu's verdicts
    gateway-peers.py report JSON                                  the table, from the JSON
    gateway-peers.py check JSON KIND                              1 if KIND broke a promise

Each measuring command prints one JSON object on stdout. Nothing here asserts: a gateway
that lets a conflicting write through, or loses an increment, is a figure of the table.
"""

import json
import subprocess
import sys
import threading
import time

BLOCK = 512
K1 = 0x1111
WRITE_EXCLUSIVE = 1
COUNTER_LBA = 4097
I1 = "iqn.2026-11.org.reservoir:peers-initiator-1"
I2 = "iqn.2026-11.org.reservoir:peers-initiator-2"


class TransportError(Exception):
    """libiscsi could not carry the command (the gateway is gone, the session lost)."""


class Client:
    """One libiscsi session: a libiscsi_cdb process logged in to one portal."""

    def __init__(self, cdb, initiator, portal, iqn, lun):
        self.lun = lun
        self.p = subprocess.Popen(
            [cdb, initiator, portal, iqn, str(lun)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        first = self.p.stdout.readline().strip()
        if first != "ready":
            err = self.p.stderr.read() if self.p.poll() is not None else ""
            raise TransportError(f"login to {portal} failed: {first} {err.strip()}")

    def cmd(self, cdb, data_in=0, data_out=None):
        """(status, (key, asc, ascq), data) of one command."""
        if data_out is not None:
            line = f"{self.lun} w {len(data_out)} {cdb.hex()} {data_out.hex()}\n"
        elif data_in:
            line = f"{self.lun} r {data_in} {cdb.hex()} -\n"
        else:
            line = f"{self.lun} n 0 {cdb.hex()} -\n"
        try:
            self.p.stdin.write(line)
            self.p.stdin.flush()
            out = self.p.stdout.readline().strip()
        except (BrokenPipeError, OSError) as e:
            raise TransportError(str(e)) from e
        if not out or out.startswith("ERROR"):
            raise TransportError(out or "the client ended")
        st, key, asc, ascq, data = out.split(" ", 4)
        return int(st), (int(key), int(asc), int(ascq)), b"" if data == "-" else bytes.fromhex(data)

    def cmd_past_ua(self, cdb, data_in=0, data_out=None):
        """The command again while it meets a unit attention (up to 8 times)."""
        for _ in range(8):
            r = self.cmd(cdb, data_in, data_out)
            if not (r[0] == 2 and r[1][0] == 6):
                return r
        return r

    def settle(self):
        """TEST UNIT READY until GOOD: the login's unit attentions taken."""
        for _ in range(16):
            if self.cmd(bytes(6))[0] == 0:
                return True
        return False

    def close(self):
        try:
            self.p.stdin.close()
        except OSError:
            pass
        try:
            self.p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


def answer(r):
    """An answer for the JSON: status name, sense, data in hex."""
    st, (key, asc, ascq), data = r
    names = {0: "GOOD", 2: "CHECK CONDITION", 8: "BUSY", 0x18: "RESERVATION CONFLICT"}
    out = {"status": names.get(st, f"0x{st:02x}")}
    if st == 2:
        out["sense"] = f"{key:02x}/{asc:02x}/{ascq:02x}"
    if data:
        out["data"] = data.hex()
    return out


def prout(sa, kind, key, sa_key):
    """(CDB, 0, parameter list) of a PERSISTENT RESERVE OUT."""
    params = key.to_bytes(8, "big") + sa_key.to_bytes(8, "big") + bytes(8)
    return bytes([0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0]), 0, params


def prin(sa):
    return bytes([0x5E, sa, 0, 0, 0, 0, 0, 4, 0, 0])


def rw10(op, lba, blocks=1):
    return bytes([op, 0]) + lba.to_bytes(4, "big") + bytes([0]) + blocks.to_bytes(2, "big") + bytes([0])


def keys_of(data):
    """READ KEYS: the registered keys."""
    if len(data) < 8:
        return None
    n = int.from_bytes(data[4:8], "big")
    return [int.from_bytes(data[8 + i : 16 + i], "big") for i in range(0, min(n, len(data) - 8), 8)]


def reservation_of(data):
    """READ RESERVATION: (key, type) or None when there is none."""
    if len(data) < 8 or int.from_bytes(data[4:8], "big") < 16 or len(data) < 24:
        return None
    return int.from_bytes(data[8:16], "big"), data[21] & 0x0F


def pr(cdb, iqn, lun, p1, p2):
    """Initiator A registers and reserves WRITE EXCLUSIVE through gateway 1; initiator B,
    on gateway 2, reads the keys and the reservation and writes. Across one logical unit
    B must find A's reservation and its write must meet RESERVATION CONFLICT."""
    a = Client(cdb, I1, p1, iqn, lun)
    b = Client(cdb, I2, p2, iqn, lun)
    a.settle()
    b.settle()
    steps = []

    def step(who, name, c, cdb, data_in=0, data_out=None):
        r = c.cmd_past_ua(cdb, data_in, data_out)
        steps.append({"initiator": who, "command": name, **answer(r)})
        return r

    # The gateways are fresh (the script starts them on a new image): no registration yet.
    step("A", f"PR OUT REGISTER key 0x{K1:x} via gateway 1", a, *prout(0, 0, 0, K1))
    step("A", "PR OUT RESERVE WRITE EXCLUSIVE via gateway 1", a, *prout(1, WRITE_EXCLUSIVE, K1, 0))
    ka = step("A", "PR IN READ KEYS via gateway 1", a, prin(0), 1024)
    kb = step("B", "PR IN READ KEYS via gateway 2", b, prin(0), 1024)
    rb = step("B", "PR IN READ RESERVATION via gateway 2", b, prin(1), 1024)
    wb = step("B", "WRITE(10) LBA 8 via gateway 2", b, rw10(0x2A, 8), 0, b"\xbb" * BLOCK)
    wa = step("A", "WRITE(10) LBA 8 via gateway 1 (the holder)", a, rw10(0x2A, 8), 0, b"\xaa" * BLOCK)
    rd = step("B", "READ(10) LBA 8 via gateway 2", b, rw10(0x28, 8), BLOCK)
    # Leave nothing behind for the measurements that follow on the same image.
    step("A", "PR OUT CLEAR via gateway 1 (clean end)", a, *prout(3, 0, K1, 0))
    a.close()
    b.close()
    seen_b = reservation_of(rb[2]) if rb[0] == 0 else None
    out = {
        "steps": steps,
        "keys_via_gateway_1": keys_of(ka[2]) if ka[0] == 0 else None,
        "keys_via_gateway_2": keys_of(kb[2]) if kb[0] == 0 else None,
        "reservation_via_gateway_2": None if seen_b is None else {"key": seen_b[0], "type": seen_b[1]},
        "write_via_gateway_2": answer(wb)["status"],
        "holder_write_via_gateway_1": answer(wa)["status"],
        "block_read_via_gateway_2": rd[2][:1].hex() if rd[0] == 0 else None,
    }
    out["holds_across_gateways"] = (
        wb[0] == 0x18 and seen_b is not None and seen_b == (K1, WRITE_EXCLUSIVE)
    )
    return out


def counter_block(n):
    b = bytearray((i * 7 + 3) & 0xFF for i in range(BLOCK))
    b[:8] = n.to_bytes(8, "little")
    return bytes(b)


def caw16(lba, blocks=1):
    c = bytearray(16)
    c[0] = 0x89
    c[2:10] = lba.to_bytes(8, "big")
    c[13] = blocks
    return bytes(c)


def caw(cdb, iqn, lun, p1, p2, per, mode="caw"):
    """The counter race: `per` increments from each of two initiators, one per gateway,
    each a READ then COMPARE AND WRITE old -> old + 1, again from the READ on MISCOMPARE.
    An increment is acknowledged when its COMPARE AND WRITE ends GOOD; an atomic COMPARE
    AND WRITE across the gateways ends with the counter at exactly the acknowledged
    count. With mode "rcw" the initiators compare themselves and send a plain WRITE (what
    is left without COMPARE AND WRITE): the same race, which loses updates, shows that the
    count can tell. A gateway that refuses the opcode (INVALID COMMAND OPERATION CODE) ends
    the race at once."""
    a = Client(cdb, I1, p1, iqn, lun)
    b = Client(cdb, I2, p2, iqn, lun)
    a.settle()
    b.settle()
    # Block Limits: MAXIMUM COMPARE AND WRITE LENGTH, as each gateway states it.
    limits = []
    for c in (a, b):
        r = c.cmd_past_ua(bytes([0x12, 1, 0xB0, 0, 64, 0]), 64)
        limits.append(r[2][5] if r[0] == 0 and len(r[2]) > 5 else None)
    a.cmd_past_ua(rw10(0x2A, COUNTER_LBA), 0, counter_block(0))
    tally = {"acknowledged": 0, "miscompares": 0, "other": {}, "torn": 0, "refused": None}
    lock = threading.Lock()

    def other(what, r):
        """Counts an answer that is neither GOOD nor MISCOMPARE; whether to stop."""
        key = f"{what} {answer(r).get('status')} {answer(r).get('sense', '')}".strip()
        with lock:
            tally["other"][key] = tally["other"].get(key, 0) + 1
            if r[0] == 2 and r[1][:2] == (5, 0x20):
                tally["refused"] = key
            return tally["refused"] is not None or sum(tally["other"].values()) > 1000

    def run(c):
        done = 0
        while done < per:
            r = c.cmd(rw10(0x28, COUNTER_LBA), BLOCK)
            cur = r[2]
            if r[0] != 0 or len(cur) != BLOCK:
                if other("READ", r):
                    return
                continue
            v = int.from_bytes(cur[:8], "little")
            if cur != counter_block(v):
                with lock:
                    tally["torn"] += 1
            if mode == "caw":
                r = c.cmd(caw16(COUNTER_LBA), 0, cur + counter_block(v + 1))
            else:
                r = c.cmd(rw10(0x2A, COUNTER_LBA), 0, counter_block(v + 1))
            if r[0] == 0:
                done += 1
                with lock:
                    tally["acknowledged"] += 1
            elif r[0] == 2 and r[1][0] == 0x0E:
                with lock:
                    tally["miscompares"] += 1
            elif other("COMPARE AND WRITE" if mode == "caw" else "WRITE", r):
                return
            with lock:
                if tally["refused"] is not None:
                    return

    t = time.monotonic()
    threads = [threading.Thread(target=run, args=(c,)) for c in (a, b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    secs = time.monotonic() - t
    end = a.cmd_past_ua(rw10(0x28, COUNTER_LBA), BLOCK)[2]
    final = int.from_bytes(end[:8], "little")
    a.close()
    b.close()
    return {
        "mode": "COMPARE AND WRITE" if mode == "caw" else "READ, compare in the initiator, WRITE",
        "increments_asked": 2 * per,
        "final_counter": final,
        "lost": tally["acknowledged"] - final,
        "max_compare_and_write_blocks": limits,
        "seconds": round(secs, 2),
        "acknowledged_per_s": round(tally["acknowledged"] / secs, 1) if secs > 0 else None,
        **tally,
    }


STATES = {0: "AO", 1: "ANO", 2: "S", 3: "U", 4: "LBD", 0xE: "O", 0xF: "T"}


def rtpg_cdb():
    # REPORT TARGET PORT GROUPS, length-only header (the format every target knows).
    return bytes([0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0])


def parse_rtpg(d):
    groups = []
    at = 4
    while at + 8 <= len(d):
        g = d[at:]
        groups.append({"group": int.from_bytes(g[2:4], "big"), "state": STATES.get(g[0] & 0x0F, hex(g[0] & 0x0F)), "ports": g[7]})
        at += 8 + 4 * g[7]
    return groups


def rtpg(c):
    r = c.cmd_past_ua(rtpg_cdb(), 1024)
    return (parse_rtpg(r[2]) if r[0] == 0 else None), answer(r)


def alua(cdb, iqn, lun, p1, p2):
    """What each gateway says of ALUA: INQUIRY's TPGS field, REPORT TARGET PORT GROUPS,
    and SET TARGET PORT GROUPS asking for the states it reported (no change) through
    gateway 1."""
    out = {}
    for name, p, ini in (("gateway_1", p1, I1), ("gateway_2", p2, I2)):
        c = Client(cdb, ini, p, iqn, lun)
        c.settle()
        inq = c.cmd_past_ua(bytes([0x12, 0, 0, 0, 96, 0]), 96)
        tpgs = (inq[2][5] >> 4) & 3 if inq[0] == 0 and len(inq[2]) > 5 else None
        groups, ans = rtpg(c)
        g = {"tpgs": {0: "none", 1: "implicit", 2: "explicit", 3: "implicit and explicit"}.get(tpgs), "rtpg": groups if groups is not None else ans}
        if name == "gateway_1":
            descs = b"".join(bytes([0, 0]) + x["group"].to_bytes(2, "big") for x in (groups or [{"group": 1}]))
            params = bytes(4) + descs
            cdb_stpg = bytes([0xA4, 0x0A, 0, 0, 0, 0]) + len(params).to_bytes(4, "big") + bytes(2)
            g["stpg"] = answer(c.cmd_past_ua(cdb_stpg, 0, params))
        out[name] = g
        c.close()
    return out


def watch(cdb, iqn, lun, portal, seconds):
    """After the other gateway was killed: REPORT TARGET PORT GROUPS through this one every
    200 ms, each change of its answer with the time it came; and whether a READ passes."""
    c = Client(cdb, I1, portal, iqn, lun)
    t = time.monotonic()
    seen = []
    last = None
    while time.monotonic() - t < seconds:
        groups, ans = rtpg(c)
        now = groups if groups is not None else ans
        if now != last:
            seen.append({"after_s": round(time.monotonic() - t, 2), "answer": now})
            last = now
        if groups is None:
            break
        if any(g["state"] in ("U", "O") for g in groups):
            break
        time.sleep(0.2)
    read = answer(c.cmd_past_ua(rw10(0x28, 0), BLOCK))
    read.pop("data", None)
    c.close()
    return {"changes": seen, "read_after": read}


def active(cdb, iqn, lun, seconds, portals):
    """Waits until every gateway reports every group active/optimized (a gateway group
    judges its peers from heartbeats, so for some seconds after a start a peer is
    transitioning); a target without ALUA counts as ready at once."""
    t = time.monotonic()
    clients = [Client(cdb, I1, p, iqn, lun) for p in portals]
    ok = False
    while time.monotonic() - t < seconds:
        states = [rtpg(c)[0] for c in clients]
        if all(s is None or all(g["state"] == "AO" for g in s) for s in states):
            ok = True
            break
        time.sleep(0.2)
    for c in clients:
        c.settle()
        c.close()
    return {"all_active": ok, "after_s": round(time.monotonic() - t, 2)}


def suite(log):
    """iscsi-test-cu's output: tests run, the names of those that FAILED, skip notes, and
    each failed test's own lines (its messages say why)."""
    name_suite, current, failed, ran, skipped = "", "", [], 0, 0
    lines_of, why = {}, {}
    for line in open(log, errors="replace"):
        line = line.rstrip("\n")
        if line.startswith("Suite: "):
            name_suite = line[7:].strip()
        elif line.lstrip().startswith("Test: "):
            ran += 1
            rest = line.lstrip()[6:]
            name, _, tail = rest.partition(" ...")
            current = f"{name_suite}.{name}"
            lines_of[current] = []
            if tail.lstrip().startswith("FAILED"):
                failed.append(current)
        elif line.startswith("FAILED"):
            failed.append(current)
        if current in lines_of and len(lines_of[current]) < 400:
            lines_of[current].append(line)
        if "[SKIPPED]" in line:
            skipped += 1
    failed = sorted(set(failed))
    for f in failed:
        # The lines that say what went wrong, else the test's last lines.
        ls = lines_of.get(f, [])
        bad = [x.strip() for x in ls if "[FAILED]" in x or "Expected" in x or "FAILED" in x]
        why[f] = (bad or [x.strip() for x in ls])[-8:]
    return {"ran": ran, "failed": len(failed), "failed_tests": failed, "skip_notes": skipped, "why": why}


def report(path):
    """The side-by-side table from the bench's JSON, as Markdown (the rows docs/gateway.md
    shows)."""
    r = json.load(open(path))
    kinds = [k for k in ("reservoir", "tgt") if k in r["kinds"]]
    head = {"reservoir": "Reservoir (2 × `rsv target`, RBD)", "tgt": "tgt 1.0.85 + bs_rbd (2 × tgtd)"}

    def cell(k, f):
        try:
            return f(r["kinds"][k])
        except (KeyError, TypeError, IndexError, ZeroDivisionError) as e:
            return f"(not measured: {type(e).__name__})"

    def pr_cell(x):
        p = x["pr"]
        res = p["reservation_via_gateway_2"]
        seen = "none" if res is None else f"key 0x{res['key']:x}, type {res['type']}"
        keys = p["keys_via_gateway_2"]
        keys = "none" if not keys else ", ".join(f"0x{k:x}" for k in keys)
        return f"B's write via gw2: **{p['write_via_gateway_2']}**; via gw2 READ RESERVATION: {seen}, READ KEYS: {keys}"

    def suite_cell(x):
        s, one = x["pr_suite"], x.get("pr_suite_one_gateway")
        out = f"{s['failed']} failed of {s['ran']}"
        if one:
            only = sorted(set(s["failed_tests"]) - set(one["failed_tests"]))
            out += f" (both URLs on one gateway: {one['failed']} failed; failing only across two: {', '.join(only) or 'none'})"
        return out

    def caw_cell(x):
        c = x["caw"]
        if c["refused"]:
            return f"refused: {c['refused']} (Block Limits says {c['max_compare_and_write_blocks'][0]} blocks)"
        return (
            f"{c['final_counter']:,} of {c['acknowledged']:,} acknowledged: **{c['lost']:,} lost**, "
            f"{c['miscompares']:,} miscompares ({c['acknowledged_per_s']:.0f}/s)"
        )

    def rcw_cell(x):
        c = x["rcw"]
        return f"{c['final_counter']:,} of {c['acknowledged']:,} acknowledged: {c['lost']:,} lost"

    def alua_cell(x):
        a = x["alua"]["gateway_1"]
        rt = a["rtpg"]
        rts = ", ".join(f"{g['group']}: {g['state']}" for g in rt) if isinstance(rt, list) else f"{rt['status']} {rt.get('sense', '')}"
        st = a["stpg"]
        return f"TPGS {a['tpgs']}; RTPG: {rts}; STPG: {st['status']} {st.get('sense', '')}".strip()

    def after_kill(x):
        w = x["alua_after_kill"]

        def show(ans):
            if isinstance(ans, list):
                return ", ".join(f"{g['group']}: {g['state']}" for g in ans)
            return f"{ans['status']} {ans.get('sense', '')}".strip()

        steps = " → ".join(f"{show(c['answer'])} ({c['after_s']} s)" for c in w["changes"]) or "no answer"
        return f"RTPG: {steps}; a READ: {w['read_after']['status']}"

    def fo_cell(x):
        f = x["failover"]
        rs = f["rounds"]
        if not rs:
            return "no round"
        stalls = sorted(q["stall_s"] for q in rs)
        return (
            f"{len(rs)} kills: stall max {stalls[-1]:.2f} s (median {stalls[len(stalls) // 2]:.2f}); "
            f"{sum(q['errors'] for q in rs)} errors, {sum(q['mismatches'] for q in rs)} lost writes, {sum(q['writes'] for q in rs):,} writes; "
            f"{sum(q.get('sessions_moved', 0) for q in rs)} session moves logged"
        )

    rows = [
        ("Reservations across gateways (A registers and reserves WE via gw1, B on gw2)", pr_cell),
        ("libiscsi PR families, one URL per gateway", suite_cell),
        ("COMPARE AND WRITE counter race, one initiator per gateway", caw_cell),
        ("The same race with READ + WRITE from the initiators (no COMPARE AND WRITE: the check that the count can tell)", rcw_cell),
        ("ALUA (gw1)", alua_cell),
        ("gw1 after gw2's SIGKILL", after_kill),
        ("Failover: `rsv load` with both portals, the gateway in use SIGKILLed", fo_cell),
    ]
    lines = ["| | " + " | ".join(head[k] for k in kinds) + " |", "|---|" + "---|" * len(kinds)]
    for name, f in rows:
        lines.append(f"| {name} | " + " | ".join(str(cell(k, f)) for k in kinds) + " |")
    return "\n".join(lines)


def check(path, kind):
    """What a gateway group promises, checked on one kind's figures: a reservation holds
    across the gateways, libiscsi's PR families pass, COMPARE AND WRITE is served and
    loses no acknowledged update (while the race without it does lose some: else the
    count could not tell), and failover costs no application error and no write. The
    problems found, one a line; none when it keeps them all."""
    r = json.load(open(path))["kinds"][kind]
    bad = []
    if not (r["pr"] or {}).get("holds_across_gateways"):
        bad.append(f"the reservation made through gateway 1 did not hold through gateway 2: {r['pr'] and {k: v for k, v in r['pr'].items() if k != 'steps'}}")
    s = r["pr_suite"] or {}
    if s.get("failed", 1) or s.get("ran", 0) < 20:
        bad.append(f"libiscsi's PR families: {s.get('failed')} failed of {s.get('ran')}: {s.get('failed_tests')}")
    c = r["caw"] or {}
    if c.get("refused") or c.get("lost", 1) != 0 or c.get("acknowledged") != c.get("increments_asked"):
        bad.append(f"COMPARE AND WRITE: refused {c.get('refused')}, {c.get('lost')} lost, {c.get('acknowledged')} of {c.get('increments_asked')} acknowledged")
    if (r["rcw"] or {}).get("lost", 0) <= 0:
        bad.append("the race without COMPARE AND WRITE lost nothing: the count cannot tell")
    for i, q in enumerate(r["failover"]["rounds"], 1):
        if q["errors"] != 0 or q["mismatches"] != 0:
            bad.append(f"failover round {i}: {q['errors']} errors, {q['mismatches']} lost writes")
        if q.get("sessions_moved", 1) == 0:
            bad.append(f"failover round {i}: no session moved (the kill missed the gateway in use?)")
    return bad


def main():
    a = sys.argv[1:]
    if not a or a[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd = a[0]
    if cmd == "pr":
        out = pr(a[1], a[2], int(a[3]), a[4], a[5])
    elif cmd == "caw":
        out = caw(a[1], a[2], int(a[3]), a[4], a[5], int(a[6]), a[7] if len(a) > 7 else "caw")
    elif cmd == "alua":
        out = alua(a[1], a[2], int(a[3]), a[4], a[5])
    elif cmd == "watch":
        out = watch(a[1], a[2], int(a[3]), a[4], float(a[5]))
    elif cmd == "active":
        out = active(a[1], a[2], int(a[3]), float(a[4]), a[5:])
    elif cmd == "zero":
        c = Client(a[1], I1, a[4], a[2], int(a[3]))
        c.settle()
        out = answer(c.cmd_past_ua(rw10(0x2A, int(a[5])), 0, bytes(BLOCK)))
        c.close()
    elif cmd == "suite":
        out = suite(a[1])
    elif cmd == "report":
        print(report(a[1]))
        return 0
    elif cmd == "check":
        bad = check(a[1], a[2])
        for b in bad:
            print(f"{a[2]}: {b}", file=sys.stderr)
        return 1 if bad else 0
    else:
        print(f"unknown command {cmd!r}; see --help", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TransportError as e:
        print(json.dumps({"transport_error": str(e)}))
        sys.exit(1)
