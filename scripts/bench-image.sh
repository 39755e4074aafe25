#!/usr/bin/env bash
# Benchmark (not a test): what a point-in-time image costs the target's writes. One
# `rsv target` on loopback with a 256 MiB file LUN (written whole first) and its sync agent;
# `rsv bench` 4 KiB random writes (queue depth 32 by default) with no image and with an
# image held (a cut taken through the agent, as `rsv sync` takes it), alternating ROUNDS
# times, and the ratio of the medians. Also, in process, a 4 KiB write to a RAM store
# alone and through the image layer with no image held (the layer's cost on every write).
# The test binary's `bench_image_write_overhead` (tests/dr.rs, ignored) does the work.
#
#   scripts/bench-image.sh [SECONDS] [ROUNDS]      (default 5 s per run, 2 rounds)
#
# Build first, then measure alone on a shared machine:
#   flock -s /tmp/bench.lock cargo test -p rsv --all-features --test dr --no-run
#   flock -x /tmp/bench.lock scripts/bench-image.sh 5 3
# JSON to $OUT (default lab/bench/image.json).
set -euo pipefail
cd "$(dirname "$0")/.."
export RSV_BENCH_SECS=${1:-5}
export RSV_BENCH_ROUNDS=${2:-2}
export RSV_BENCH_JSON=${OUT:-$PWD/lab/bench/image.json}
export RSV_PATH_CACHE=off
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cargo test -q -p rsv --all-features --test dr -- --ignored --exact bench_image_write_overhead --nocapture
echo "JSON: $RSV_BENCH_JSON" >&2
