#!/usr/bin/env bash
# Benchmark (not a test): two builds of `rsv` against each other, each one whole (its own
# target and its own `rsv bench`), alternated in one sitting: for a change of profile or of
# the TLS library, which touches both ends.
#
#   RSV_A=old/rsv RSV_B=new/rsv scripts/bench-build.sh [SECONDS] [ROUNDS]
#                                   (default 5 s per measurement, 3 rounds)
#
# Each build serves one RAM LUN (1 GiB) on two loopback portals, plain TCP and TLS 1.3 (a
# self-signed P-256 certificate made here with openssl, pinned by the initiator; SUITE
# picks the one suite offered: aes128, aes256 or chacha20; default rustls's preference).
# Rows, QD32, one connection: 1 MiB sequential writes then reads, plain and TLS, and 4 KiB
# random reads, plain. Every round measures A then B, the next B then A, so that drift of
# the machine falls on both. Per measurement: MB/s and the CPU seconds per GiB moved of the
# target (/proc/PID/stat) and of `rsv bench` (its rusage). Per row: the medians over the
# rounds, the runs, and B's over A's (MB/s; CPU per GiB, lower is cheaper).
#
# Run it under `flock -x /tmp/bench.lock` on a shared machine; on two cores shared with
# other work, MB/s says how the cores were shared and CPU s/GiB what each path costs. The
# load average is printed before and after; JSON to $OUT (default lab/bench/build.json).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-5}
ROUNDS=${2:-3}
OUT=${OUT:-lab/bench/build.json}
: "${RSV_A:?RSV_A=path to the first build of rsv}" "${RSV_B:?RSV_B=path to the second}"
export RSV_PATH_CACHE=off

. scripts/lib.sh
scratch rsv-buildbench

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$work/t.key" -out "$work/t.crt" 2>/dev/null
chmod 600 "$work/t.key"
pin=sha256:$(openssl x509 -in "$work/t.crt" -outform der | sha256sum | cut -d' ' -f1)
IQN=iqn.2026-11.org.reservoir:bench-build

# start NAME BINARY: the build's target; sets PID_NAME, PLAIN_NAME, TLS_NAME.
start() {
  local name=$1 bin=$2 plain tls i
  plain=127.0.0.1:$(free_port)
  tls=127.0.0.1:$(free_port)
  mkdir -p "$work/$name"
  cat >"$work/$name.toml" <<TOML
portals = ["$plain", { listen = "$tls", tls = { cert = "$work/t.crt", key = "$work/t.key" } }]
data_dir = "$work/$name"
[[target]]
iqn = "$IQN"
[[target.lun]]
id = 0
store = "ram:?size=1GiB"
TOML
  "$bin" target --config "$work/$name.toml" >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
  printf -v "PID_$name" '%s' "$!"
  for i in $(seq 300); do
    grep -q '^ready' "$work/$name.out" 2>/dev/null && break
    sleep 0.1
  done
  grep -q '^ready' "$work/$name.out" || { cat "$work/$name.log" >&2; exit 1; }
  printf -v "PLAIN_$name" '%s' "$plain"
  printf -v "TLS_$name" '%s' "$tls"
}
start A "$RSV_A"
start B "$RSV_B"

load0=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$SECS" "$ROUNDS" "$OUT" "$load0" "$pin" "${SUITE:-}" \
  "A" "$RSV_A" "$PID_A" "$PLAIN_A" "$TLS_A" "B" "$RSV_B" "$PID_B" "$PLAIN_B" "$TLS_B" <<'PY'
import json, os, resource, statistics, subprocess, sys
secs, rounds, out, load0, pin, suite = sys.argv[1:7]
rounds = int(rounds)
iqn = "iqn.2026-11.org.reservoir:bench-build"
builds = {}
for i in (7, 12):
    name, rsv, pid, plain, tls = sys.argv[i:i + 5]
    builds[name] = dict(rsv=rsv, pid=pid, plain=plain, tls=tls)
tick = os.sysconf("SC_CLK_TCK")

def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick

def url(b, carrier):
    if carrier == "plain":
        return f"iscsi://{b['plain']}/{iqn}/0"
    return f"iscsi://{b['tls']}/{iqn}/0?pin={pin}" + (f"&tls_suite={suite}" if suite else "")

ROWS = [("write", "1M", "seq", "plain"), ("write", "1M", "seq", "tls"),
        ("read", "1M", "seq", "plain"), ("read", "1M", "seq", "tls"),
        ("read", "4k", "rand", "plain")]

def measure(b, rw, bs, pattern, carrier):
    t0, ru0 = cpu(b["pid"]), resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([b["rsv"], "bench", "--json", "--rw", rw, "--pattern", pattern,
                        "--block-size", bs, "--queue-depth", "32", "--connections", "1",
                        "--duration", secs, url(b, carrier)], capture_output=True)
    if p.returncode != 0:
        sys.exit(p.stderr.decode())
    t1, ru1 = cpu(b["pid"]), resource.getrusage(resource.RUSAGE_CHILDREN)
    d = json.loads(p.stdout)
    size = (1 << 20) if bs == "1M" else 4096
    gib = d["iops"] * d.get("seconds", float(secs)) * size / (1 << 30)
    ini = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return {"mbs": d["iops"] * size / 1e6, "target": (t1 - t0) / gib, "initiator": ini / gib}

runs = {(r, n): [] for r in ROWS for n in builds}
for k in range(rounds):
    order = ["A", "B"] if k % 2 == 0 else ["B", "A"]
    for row in ROWS:
        for n in order:
            m = measure(builds[n], *row)
            runs[(row, n)].append(m)
            print(f"round {k + 1} {n} {' '.join(row)}: {m['mbs']:.0f} MB/s, "
                  f"target {m['target']:.3f}, rsv {m['initiator']:.3f} CPU s/GiB", file=sys.stderr)
load1 = " ".join(open("/proc/loadavg").read().split()[:3])

med = lambda xs: statistics.median(xs)
print()
print(f"{os.cpu_count()} cores; {secs} s per measurement, {rounds} rounds alternating; QD32, 1 connection, ram LUN 1 GiB"
      + (f"; TLS suite {suite}" if suite else ""))
print(f"A = {builds['A']['rsv']}\nB = {builds['B']['rsv']}")
print(f"load average before {load0}, after {load1}")
hdr = f"{'row':<24}{'A MB/s':>9}{'B MB/s':>9}{'B/A':>7}   {'target s/GiB A / B':>20}   {'rsv s/GiB A / B':>17}"
print(hdr)
rows_json = []
for row in ROWS:
    a, b = runs[(row, "A")], runs[(row, "B")]
    am, bm = med([x["mbs"] for x in a]), med([x["mbs"] for x in b])
    at, bt = med([x["target"] for x in a]), med([x["target"] for x in b])
    ai, bi = med([x["initiator"] for x in a]), med([x["initiator"] for x in b])
    name = f"{row[0]} {row[1]} {row[2]} {row[3]}"
    print(f"{name:<24}{am:>9.0f}{bm:>9.0f}{bm / am:>7.3f}   {at:>9.3f} / {bt:<8.3f}   {ai:>7.3f} / {bi:<7.3f}"
          f"   runs A {' '.join('%.0f' % x['mbs'] for x in a)} | B {' '.join('%.0f' % x['mbs'] for x in b)}")
    rows_json.append({"row": name, "a_mb_s": round(am, 1), "b_mb_s": round(bm, 1), "ratio": round(bm / am, 3),
                      "a_target_cpu_s_per_gib": round(at, 3), "b_target_cpu_s_per_gib": round(bt, 3),
                      "a_rsv_cpu_s_per_gib": round(ai, 3), "b_rsv_cpu_s_per_gib": round(bi, 3),
                      "a_runs_mb_s": [round(x["mbs"], 1) for x in a], "b_runs_mb_s": [round(x["mbs"], 1) for x in b]})
json.dump({"seconds": float(secs), "rounds": rounds, "nproc": os.cpu_count(), "suite": suite or "default",
           "a": builds["A"]["rsv"], "b": builds["B"]["rsv"], "loadavg_before": load0, "loadavg_after": load1,
           "rows": rows_json}, open(out, "w"), indent=1)
print(f"(JSON in {out})")
PY
