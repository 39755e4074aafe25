#!/usr/bin/env bash
# Benchmark (not a test): what a far cycle's undo log costs the target's writes. One
# `rsv target` on loopback with a 256 MiB file LUN (written whole first) and its sync
# agent; `rsv bench` 4 KiB random writes at queue depth 1 and 32 with no cycle open and
# with one opened through the agent (as a sync opens it at the far site), alternating
# ROUNDS times; p50 and p99 of each, and the units the cycle saved against the syncs of
# its log (grouped saves share syncs). The test binary's `bench_undo_write_overhead`
# (tests/dr.rs, ignored) does the work. Then (unless SYNC=0) what a cycle costs the sync
# itself: `rsv sync --full --pacing unpaced` of 256 MiB over loopback into a far LUN with
# an undo log and into one without, alternating ROUNDS times (`bench_undo_sync_rate`).
#
#   scripts/bench-undo.sh [SECONDS] [ROUNDS]      (default 5 s per run, 2 rounds)
#
# Build first, then measure alone on a shared machine:
#   flock -s /tmp/bench.lock cargo test -p rsv --all-features --test dr --no-run
#   flock -x /tmp/bench.lock scripts/bench-undo.sh 5 2
# JSON to $OUT (default lab/bench/undo.json) and $SYNC_OUT (lab/bench/undo-sync.json).
# Figures: docs/bench-undo.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export RSV_BENCH_SECS=${1:-5}
export RSV_BENCH_ROUNDS=${2:-2}
export RSV_BENCH_JSON=${OUT:-$PWD/lab/bench/undo.json}
export RSV_BENCH_SYNC_JSON=${SYNC_OUT:-$PWD/lab/bench/undo-sync.json}
export RSV_PATH_CACHE=off
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cargo test -q -p rsv --all-features --test dr -- --ignored --exact bench_undo_write_overhead --nocapture
if [ "${SYNC:-1}" != 0 ]; then
    echo "load between: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    cargo test -q -p rsv --all-features --test dr -- --ignored --exact bench_undo_sync_rate --nocapture
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "JSON: $RSV_BENCH_JSON, $RSV_BENCH_SYNC_JSON" >&2
