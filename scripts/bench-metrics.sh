#!/usr/bin/env bash
# Benchmark (not a test): what metrics cost the target. Two targets started here on
# loopback, each one LUN in RAM, the same build: one without metrics, one with
# `--metrics` scraped every second by a Prometheus server of this run. `rsv bench` reads
# 4 KiB (random) and 1 MiB (sequential) from each, alternating (A B B A, ROUNDS times), so
# that drift of the machine falls on both; the ratio with ÷ without is given per size from
# the medians (goal: >= 0.98). Then a scrape timing: `rsv load` holds 256 sessions of
# mixed I/O on the target with metrics, and 50 scrapes of /metrics are timed with curl
# (goal: <= 20 ms), with the CPU time the target's own runtime threads (`rsv-target`,
# where /metrics is served) spent over them: a figure a busy machine does not inflate.
#
#   scripts/bench-metrics.sh [SECONDS] [ROUNDS]     (default 10 s per run, 3 rounds)
#
# Run it under `flock -x /tmp/bench.lock` on a shared machine. Prints a table; JSON to
# $OUT (default lab/bench/metrics.json). Environment: RSV=path to a built rsv (else
# `cargo build --release` here, honouring CARGO_TARGET_DIR); QD (default 32); SESSIONS
# (default 256).
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-10}
ROUNDS=${2:-3}
OUT=${OUT:-lab/bench/metrics.json}
QD=${QD:-32}
SESSIONS=${SESSIONS:-256}
if [ -z "${RSV:-}" ]; then
  ./scripts/setup.sh
  cargo build --release --bin rsv >/dev/null
  RSV=${CARGO_TARGET_DIR:-$PWD/target}/release/rsv
fi
export RSV_PATH_CACHE=off

. scripts/lib.sh
scratch rsv-metricsbench


IQN=iqn.2026-11.org.reservoir:bench-metrics
# start_target NAME [rsv target flags...]: sets PORTAL_NAME (and METRICS_NAME with metrics).
start_target() {
  local name=$1
  shift
  printf '[[target]]\niqn = "%s"\n[[target.lun]]\nid = 0\nstore = "ram:?size=1GiB"\n' "$IQN" \
    >"$work/$name.toml"
  "$RSV" target --config "$work/$name.toml" --listen 127.0.0.1:0 --data-dir "$work" "$@" \
    >"$work/$name.out" 2>"$work/$name.log" &
  pids+=($!)
  printf -v "PID_$name" '%s' "$!"
  local i
  for i in $(seq 300); do
    grep -q '^ready$' "$work/$name.out" && break
    sleep 0.1
  done
  grep -q '^ready$' "$work/$name.out" || { cat "$work/$name.log" >&2; exit 1; }
  printf -v "PORTAL_$name" '%s' "$(sed -n 's/^portal //p' "$work/$name.out" | head -1)"
  printf -v "METRICS_$name" '%s' "$(sed -n 's/^metrics //p' "$work/$name.out" | head -1)"
}
start_target off
start_target on --metrics 127.0.0.1:0
url() { echo "iscsi://$1/$IQN/0"; }

# Prometheus scrapes the target with metrics every second for the whole run.
pport=$(free_port)
printf 'global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: rsv\n    static_configs:\n      - targets: [\x27%s\x27]\n' \
  "$METRICS_on" >"$work/prometheus.yml"
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$pport" >"$work/prometheus.log" 2>&1 &
prometheus_pid=$!
pids+=($prometheus_pid)
for i in $(seq 300); do
  curl -sf "http://127.0.0.1:$pport/-/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
scraped() { # the scrapes of the target Prometheus has taken so far
  curl -sf "http://127.0.0.1:$pport/api/v1/query" --data-urlencode 'query=count_over_time(up{job="rsv"}[1h])' |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)'
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
bench() { # portal block-size pattern -> MB/s
  timeout $((SECS + 30)) "$RSV" bench --json --rw read --pattern "$3" --block-size "$2" \
    --queue-depth "$QD" --duration "$SECS" "$(url "$1")" 2>"$work/bench.err" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["MB_per_s"])' ||
    { cat "$work/bench.err" >&2; echo 0; }
}
declare -A runs
scrapes0=$(scraped)
for r in $(seq "$ROUNDS"); do
  for size in 4k:rand 1M:seq; do
    bs=${size%%:*} pat=${size##*:}
    # A B B A: the one measured first alternates within the round.
    a=$(bench "$PORTAL_off" "$bs" "$pat")
    b=$(bench "$PORTAL_on" "$bs" "$pat")
    b2=$(bench "$PORTAL_on" "$bs" "$pat")
    a2=$(bench "$PORTAL_off" "$bs" "$pat")
    runs[$bs.off]+="$a $a2 "
    runs[$bs.on]+="$b $b2 "
    echo "round $r, $bs: without $a $a2, with $b $b2 MB/s" >&2
  done
done
scrapes=$(($(scraped) - scrapes0))
# Its part is done: the scrape timing below counts ours alone.
kill "$prometheus_pid" 2>/dev/null || true
load1=$(cut -d' ' -f1-3 /proc/loadavg)

median() { python3 -c 'import statistics,sys; print(f"{statistics.median(float(x) for x in sys.argv[1:]):.1f}")' "$@"; }
ratio() { python3 -c "print(f'{$1/$2:.3f}' if $2 else 'n/a')"; }

# The scrape timing: SESSIONS sessions of mixed I/O on the target with metrics.
"$RSV" load "$(url "$PORTAL_on")" --sessions "$SESSIONS" --connections 1 --duration 120s \
  --region 256KiB >"$work/load.out" 2>"$work/load.err" &
load_pid=$!
pids+=($load_pid)
metric() { # name -> value in a scrape
  curl -sf "http://$METRICS_on/metrics" | awk -v n="$1" '$1 == n { print $2 }'
}
for i in $(seq 600); do
  [ "$(metric rsv_target_sessions)" = "$SESSIONS" ] && break
  sleep 0.1
done
sessions=$(metric rsv_target_sessions)
# CPU time (ns) of the target's threads named rsv-target: its runtime, which serves /metrics
# (the connections run on rsv-core threads).
runtime_cpu_ns() {
  local t sum=0
  for t in /proc/"$PID_on"/task/*; do
    [ "$(cat "$t/comm" 2>/dev/null)" = rsv-target ] || continue
    sum=$((sum + $(cut -d' ' -f1 "$t/schedstat" 2>/dev/null || echo 0)))
  done
  echo "$sum"
}
: >"$work/times"
cpu0=$(runtime_cpu_ns)
for i in $(seq 50); do
  curl -s -o /dev/null -w '%{time_total}\n' \
    -H 'Accept: application/openmetrics-text; version=1.0.0' "http://$METRICS_on/metrics" >>"$work/times"
  sleep 0.1
done
cpu1=$(runtime_cpu_ns)
scrape_cpu=$(python3 -c "print(f'{($cpu1 - $cpu0) / 50 / 1e6:.2f}')")
bytes=$(curl -s -H 'Accept: application/openmetrics-text; version=1.0.0' "http://$METRICS_on/metrics" | wc -c)
kill "$load_pid" 2>/dev/null || true
read -r scrape_med scrape_p90 scrape_max < <(python3 -c '
import statistics, sys
t = sorted(float(x) * 1000 for x in open(sys.argv[1]))
print(f"{statistics.median(t):.2f} {t[int(len(t) * 0.9)]:.2f} {t[-1]:.2f}")' "$work/times")

echo
printf '%-22s %12s %12s %8s   %s\n' "read, QD$QD" "without MB/s" "with MB/s" ratio "runs (MB/s): without | with"
json_rows=()
for bs in 4k 1M; do
  off=$(median ${runs[$bs.off]})
  on=$(median ${runs[$bs.on]})
  printf '%-22s %12s %12s %8s   %s| %s\n' "$bs $([ "$bs" = 4k ] && echo random || echo sequential)" \
    "$off" "$on" "$(ratio "$on" "$off")" "${runs[$bs.off]}" "${runs[$bs.on]}"
  json_rows+=("{\"block_size\": \"$bs\", \"without_mb_s\": $off, \"with_mb_s\": $on, \"ratio\": $(ratio "$on" "$off"), \"without_runs\": [$(echo ${runs[$bs.off]} | tr ' ' ,)], \"with_runs\": [$(echo ${runs[$bs.on]} | tr ' ' ,)]}")
done
echo "goal: ratio >= 0.98 (medians of $((2 * ROUNDS)) runs of ${SECS} s each, alternating); Prometheus took $scrapes scrapes meanwhile"
echo "scrape with $sessions sessions of mixed I/O (rsv load): median $scrape_med ms, p90 $scrape_p90 ms, max $scrape_max ms over 50; $bytes bytes (goal: <= 20 ms); CPU of the target's runtime threads $scrape_cpu ms per scrape"
echo "load average before: $load0, after the benches: $load1 (nproc $(nproc))"
{
  echo "{\"seconds\": $SECS, \"rounds\": $ROUNDS, \"queue_depth\": $QD, \"nproc\": $(nproc),"
  echo " \"loadavg_before\": \"$load0\", \"loadavg_after\": \"$load1\", \"prometheus_scrapes\": $scrapes,"
  echo " \"scrape\": {\"sessions\": ${sessions:-0}, \"median_ms\": $scrape_med, \"p90_ms\": $scrape_p90, \"max_ms\": $scrape_max, \"bytes\": $bytes, \"runtime_cpu_ms_per_scrape\": $scrape_cpu},"
  echo " \"rows\": ["
  (IFS=,; echo "${json_rows[*]}" | sed 's/},{/},\n{/g')
  echo "]}"
} >"$OUT"
