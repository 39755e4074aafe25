#!/usr/bin/env python3
"""What the processes of a lab run cost: CPU seconds and bytes written, per role.

Samples /proc every INTERVAL seconds until the command it runs ends, and keeps the last
sample of every process and thread (threads that end, a blocking pool's, keep their last
figure; a process's own utime+stime counts its ended threads too). Each process is given a
role from its command line (`rsv target` of site a or b, disk server or file server, by
the lab's `target-a-disk0.toml`; the `rsv sync` coordinator; the emulator's relay) and the
figures are summed per role: CPU seconds (user, system), and from /proc/PID/io the bytes
passed to write calls (`wchar`: files and sockets), the write calls (`syscw`) and the
minor page faults (`minflt`: fresh memory touched; a count that load does not change). With
--pwrite it also counts the pwrite64 calls of every process and their bytes (perf's
syscall tracepoint, system-wide): the bytes the disk servers write to their stores and
logs, apart from what they send.

Usage: proc-cpu-sample.py [--interval S] [--pwrite] --json OUT -- COMMAND...
Prints a table; writes JSON to OUT. Benchmark helper of scripts/bench-sync-cpu.sh.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

TCK = os.sysconf("SC_CLK_TCK")


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def stat_times(raw):
    # comm may hold spaces and parentheses: split after the last ')'.
    s = raw.decode(errors="replace")
    comm = s[s.index("(") + 1 : s.rindex(")")]
    f = s[s.rindex(")") + 2 :].split()
    return comm, int(f[11]) / TCK, int(f[12]) / TCK, int(f[7])


def role_of(pid, comm):
    cmd = read(f"/proc/{pid}/cmdline")
    if cmd is None:
        return None
    args = cmd.split(b"\0")
    line = b" ".join(args).decode(errors="replace")
    if comm in ("wan-ab", "wan-ba") or " wan " in line and "rsv-lab" in line:
        return "relay"
    m = re.search(r"target-([ab])-(disk\d+|fs)\.toml", line)
    if m:
        kind = "disk" if m.group(2).startswith("disk") else "fs"
        return f"{m.group(1)}-{kind}"
    if re.search(r"\brsv\b.* sync\b", line) or (args and args[0].endswith(b"rsv") and b"sync" in args[1:2]):
        return "sync"
    return None


def ppid_of(pid):
    raw = read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    s = raw.decode(errors="replace")
    return s[s.rindex(")") + 2 :].split()[1]


def descends(pid, root, seen):
    """Whether `pid` is `root` or below it (other runs on the machine are not counted)."""
    chain = []
    while pid and pid not in ("0", "1"):
        if pid in seen:
            ok = seen[pid]
            break
        if pid == root:
            ok = True
            break
        chain.append(pid)
        pid = ppid_of(pid)
    else:
        ok = False
    for c in chain:
        seen[c] = ok
    return ok


def sample(procs, threads, root, seen):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        if pid not in procs and not descends(pid, root, seen):
            continue
        raw = read(f"/proc/{pid}/stat")
        if raw is None:
            continue
        try:
            comm, ut, st, minflt = stat_times(raw)
        except (ValueError, IndexError):
            continue
        p = procs.get(pid)
        if p is None:
            # The relay's threads are named, the process is rsv-lab: look at its threads.
            role = role_of(pid, comm)
            if role is None:
                tdir = f"/proc/{pid}/task"
                try:
                    names = {
                        (read(f"{tdir}/{t}/comm") or b"").strip().decode()
                        for t in os.listdir(tdir)
                    }
                except OSError:
                    names = set()
                if names & {"wan-ab", "wan-ba"}:
                    role = "relay"
            if role is None:
                continue
            p = procs[pid] = {"role": role, "user": 0.0, "sys": 0.0, "wchar": 0, "syscw": 0}
        p["user"], p["sys"], p["minflt"] = ut, st, minflt
        io = read(f"/proc/{pid}/io")
        if io:
            for l in io.decode().splitlines():
                k, v = l.split(":")
                if k in ("wchar", "syscw"):
                    p[k] = int(v)
        tdir = f"/proc/{pid}/task"
        try:
            tids = os.listdir(tdir)
        except OSError:
            continue
        for t in tids:
            raw = read(f"{tdir}/{t}/stat")
            if raw is None:
                continue
            try:
                tc, tu, ts, _ = stat_times(raw)
            except (ValueError, IndexError):
                continue
            threads[(pid, t)] = (p["role"], tc, tu + ts)


def pwrites(perf_data):
    """pwrite64 calls and bytes per process from perf's syscall tracepoint."""
    out = subprocess.run(
        ["perf", "script", "-i", perf_data, "-F", "pid,trace"],
        capture_output=True,
        text=True,
    ).stdout
    per = {}
    for l in out.splitlines():
        m = re.match(r"\s*(\d+)\s.*count: (0x[0-9a-f]+|\d+)", l)
        if not m:
            continue
        n = int(m.group(2), 0)
        c = per.setdefault(m.group(1), {"calls": 0, "bytes": 0, "sizes": {}})
        c["calls"] += 1
        c["bytes"] += n
        c["sizes"][n] = c["sizes"].get(n, 0) + 1
    return per


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--json", required=True)
    ap.add_argument("--pwrite", action="store_true")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    perf = None
    perf_data = a.json + ".pwrite.data"
    if a.pwrite:
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-e", "syscalls:sys_enter_pwrite64", "-o", perf_data],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # perf takes a moment to start recording.
        time.sleep(2)
    load0 = open("/proc/loadavg").read().split()[:3]
    procs, threads, seen = {}, {}, {}
    child = subprocess.Popen(cmd)
    while child.poll() is None:
        sample(procs, threads, str(child.pid), seen)
        time.sleep(a.interval)
    load1 = open("/proc/loadavg").read().split()[:3]
    per_pid_pw = {}
    if perf:
        perf.send_signal(2)
        perf.wait()
        per_pid_pw = pwrites(perf_data)
    roles = {}
    for pid, p in procs.items():
        r = roles.setdefault(
            p["role"],
            {"processes": 0, "user_s": 0.0, "sys_s": 0.0, "minflt": 0, "wchar": 0, "syscw": 0,
             "pwrite_calls": 0, "pwrite_bytes": 0, "pwrite_sizes": {}},
        )
        r["processes"] += 1
        r["user_s"] += p["user"]
        r["sys_s"] += p["sys"]
        r["minflt"] += p.get("minflt", 0)
        r["wchar"] += p["wchar"]
        r["syscw"] += p["syscw"]
        pw = per_pid_pw.get(pid)
        if pw:
            r["pwrite_calls"] += pw["calls"]
            r["pwrite_bytes"] += pw["bytes"]
            for n, c in pw["sizes"].items():
                r["pwrite_sizes"][n] = r["pwrite_sizes"].get(n, 0) + c
    by_thread = {}
    for (pid, t), (role, comm, cpu) in threads.items():
        # Blocking-pool threads are numbered in some builds: one name for all of them.
        name = re.sub(r"\d+$", "N", comm) if comm.startswith("tokio") else comm
        k = f"{role}/{name}"
        e = by_thread.setdefault(k, {"cpu_s": 0.0, "threads": 0})
        e["cpu_s"] += cpu
        e["threads"] += 1
    for r in roles.values():
        top = sorted(r["pwrite_sizes"].items(), key=lambda kv: -kv[1])[:6]
        r["pwrite_sizes"] = {str(k): v for k, v in top}
    res = {
        "command": cmd,
        "exit": child.returncode,
        "load_before": load0,
        "load_after": load1,
        "roles": roles,
        "threads": by_thread,
    }
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print(f"load before {' '.join(load0)}, after {' '.join(load1)}", file=sys.stderr)
    for k, r in sorted(roles.items()):
        print(
            f"{k:8} procs {r['processes']:2} user {r['user_s']:7.2f} s sys {r['sys_s']:7.2f} s "
            f"minflt {r['minflt']:8} wchar {r['wchar'] / 2**20:9.1f} MiB syscw {r['syscw']:8} "
            f"pwrite {r['pwrite_calls']:7} calls {r['pwrite_bytes'] / 2**20:9.1f} MiB "
            f"sizes {r['pwrite_sizes']}",
            file=sys.stderr,
        )
    for k, e in sorted(by_thread.items(), key=lambda kv: -kv[1]["cpu_s"])[:20]:
        print(f"  {k:32} {e['cpu_s']:7.2f} s ({e['threads']} threads)", file=sys.stderr)
    sys.exit(child.returncode)


if __name__ == "__main__":
    main()
