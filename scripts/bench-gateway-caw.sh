#!/usr/bin/env bash
# Benchmark (not a test): COMPARE AND WRITE across a gateway group, on throw-away memstore
# Ceph clusters (scripts/ceph-cluster.sh), with the workspace's test profile (optimized).
#
#   scripts/bench-gateway-caw.sh [INCREMENTS] [OPS]
#                     (default 100000 counter increments, 2000 compare-and-writes per row)
#
# 1. The cost at the store, in one run on one cluster: librbd's compare-and-write (one OSD
#    operation, atomic against every client) against a read, a compare and a write (what a
#    target without it does: atomic only under its own lock), 512-byte ranges, one at a
#    time (p50/p90/p99 latency) and from 8 threads on distinct sectors (ops/s), each row
#    twice, alternated.
# 2. The counter race: INCREMENTS increments of a counter in one block, half from each of
#    two initiators each logged in to its own gateway (two `rsv target` processes on one
#    image), each a READ then a COMPARE AND WRITE old -> old + 1, again on MISCOMPARE; the
#    counter must end exact. Prints increments/s and the miscompares retried.
#
# Run it under `flock -x /tmp/bench.lock` on a shared machine; the load average is printed
# beside the figures (figures taken under load are upper bounds on the times).
set -euo pipefail
cd "$(dirname "$0")/.."
INCREMENTS=${1:-100000}
OPS=${2:-2000}
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)  commit: $(git rev-parse --short HEAD)"
RSV_CAW_OPS=$OPS RSV_CAW_INCREMENTS=$INCREMENTS cargo test -q -p rsv --all-features \
  --test gateway_caw -- --ignored --nocapture --test-threads 1 2>&1 |
  grep -E '^(load|librbd|read \+|CAW counter|ceph cluster)|panicked|lost updates|test result'
echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
