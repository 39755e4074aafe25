#!/usr/bin/env bash
# Benchmark (not a test): what a far cycle's undo log costs.
#
# Default: one `rsv target` on loopback with a 256 MiB file LUN (written whole first) and
# its sync agent; `rsv bench` 4 KiB random writes at queue depth 1 and 32 with no cycle
# open and with one opened through the agent (as a sync opens it at the far site),
# alternating ROUNDS times; p50 and p99 of each, and the units the cycle saved against the
# syncs of its log (grouped saves share syncs). The test binary's
# `bench_undo_write_overhead` (tests/dr.rs, ignored) does the work. Then (unless SYNC=0)
# what a cycle costs the sync itself: `rsv sync --full --pacing unpaced` of 256 MiB over
# loopback into a far LUN with an undo log and into one without, alternating ROUNDS times
# (`bench_undo_sync_rate`).
#
# `fresh`: `rsv sync --full` (unpaced, loopback) of a volume striped over two disk servers of
# SIZE each, random data, onto a new far site whose LUNs are fresh sparse files under
# DIR (default /dev/shm, as in the lab), with the far undo log on and off (`undo =
# false`), alternating ROUNDS times: each sync's seconds and rate, and the far undo
# logs' largest size seen (`bench_sync_to_fresh_far_luns`, tests/dr.rs, ignored).
#
#   scripts/bench-undo.sh [SECONDS] [ROUNDS]      (default 5 s per run, 2 rounds)
#   scripts/bench-undo.sh fresh [SIZE] [ROUNDS] [DIR]   (default 512M per disk server, 2, /dev/shm)
#
# Build first, then measure alone on a shared machine:
#   flock -s /tmp/bench.lock cargo test -p rsv --all-features --test dr --no-run
#   flock -x /tmp/bench.lock scripts/bench-undo.sh 5 2
# RSV_BIN=PATH runs another rsv binary (a build of another commit, for a before/after).
# JSON to $OUT (default lab/bench/undo.json, lab/bench/undo-fresh.json for `fresh`) and
# $SYNC_OUT (lab/bench/undo-sync.json). Figures: docs/bench-undo.md, docs/replicate.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export RSV_PATH_CACHE=off
run() { cargo test -q -p rsv --all-features --test dr -- --ignored --exact "$1" --nocapture; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [[ ${1:-} == fresh ]]; then
    export RSV_BENCH_SIZE=${2:-512M}
    export RSV_BENCH_ROUNDS=${3:-2}
    export RSV_BENCH_DIR=${4:-/dev/shm}
    export RSV_BENCH_JSON=${OUT:-$PWD/lab/bench/undo-fresh.json}
    run bench_sync_to_fresh_far_luns
else
    export RSV_BENCH_SECS=${1:-5}
    export RSV_BENCH_ROUNDS=${2:-2}
    export RSV_BENCH_JSON=${OUT:-$PWD/lab/bench/undo.json}
    export RSV_BENCH_SYNC_JSON=${SYNC_OUT:-$PWD/lab/bench/undo-sync.json}
    run bench_undo_write_overhead
    if [ "${SYNC:-1}" != 0 ]; then
        echo "load between: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        run bench_undo_sync_rate
    fi
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "JSON: $RSV_BENCH_JSON" >&2
