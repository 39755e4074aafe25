#!/usr/bin/env bash
# Benchmark (not a test): what a far cycle's undo log costs the target's writes. One
# `rsv target` on loopback with a 256 MiB file LUN (written whole first) and its sync
# agent; `rsv bench` 4 KiB random writes at queue depth 1 and 32 with no cycle open and
# with one opened through the agent (as a sync opens it at the far site), alternating
# ROUNDS times; p50 and p99 of each. The test binary's `bench_undo_write_overhead`
# (tests/dr.rs, ignored) does the work.
#
#   scripts/bench-undo.sh [SECONDS] [ROUNDS]      (default 5 s per run, 2 rounds)
#
# Build first, then measure alone on a shared machine:
#   flock -s /tmp/bench.lock cargo test -p rsv --all-features --test dr --no-run
#   flock -x /tmp/bench.lock scripts/bench-undo.sh 5 2
# JSON to $OUT (default lab/bench/undo.json).
set -euo pipefail
cd "$(dirname "$0")/.."
export RSV_BENCH_SECS=${1:-5}
export RSV_BENCH_ROUNDS=${2:-2}
export RSV_BENCH_JSON=${OUT:-$PWD/lab/bench/undo.json}
export RSV_PATH_CACHE=off
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cargo test -q -p rsv --all-features --test dr -- --ignored --exact bench_undo_write_overhead --nocapture
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "JSON: $RSV_BENCH_JSON" >&2
