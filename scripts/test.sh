#!/usr/bin/env bash
# Runs every test of Reservoir: unit, property, and end-to-end against real peers
# (libiscsi's tools, qemu-img/qemu-io, tgt, iperf3 through the WAN emulator).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The set-up is idempotent and its checks are the gate: a second run must find every real
# peer working and install nothing; if one is missing, stop here and say which.
./scripts/setup.sh --check
# Every feature: the rbd store (librbd) and the BPF congestion control are opt-in and
# opt-out for a product build (crates/rsv/Cargo.toml), both tested here.
cargo build --workspace --all-targets --all-features
# The fuzz targets are built (not run) so they cannot rot.
if [ -f fuzz/Cargo.toml ]; then
  cargo check --manifest-path fuzz/Cargo.toml --bins
fi
# Here every peer is installed and every binary built: a test that would skip fails instead.
export RESERVOIR_TEST_STRICT=1
# No path cache (net::paths) carried from one test to the next: a remembered rate would
# change another test's plan. tests/cc_wan.rs gives its copies a cache of their own.
export RSV_PATH_CACHE=off
cargo test --workspace --all-features --no-fail-fast -- --test-threads=2
