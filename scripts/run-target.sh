#!/usr/bin/env bash
# Runs Reservoir's target on its embedded default (one 1 GiB sparse LUN under ./data,
# 127.0.0.1:3260); extra arguments go to `rsv target`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec cargo run --release --bin rsv -- target "$@"
