#!/usr/bin/env bash
# Runs Reservoir's target on its embedded default (one 1 GiB sparse LUN under ./data,
# 127.0.0.1:3260); extra arguments go to `rsv target`.
#
# Serving a file LUN needs the Rust toolchain and a C compiler (the TLS library, ring,
# builds C and assembly), nothing else: not the peers the tests use (scripts/setup.sh
# installs those). The build leaves out the rbd store (`--features rbd` adds it; it needs
# Ceph's libraries) and compiles Reservoir's BPF congestion control where clang and
# libbpf-dev are. It is the `quick-release` profile (release without LTO, debug info or
# few codegen units: cheaper to build from nothing; docs/package.md has the figures).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "run-target: no cargo; install Rust (rustup), then run this again" >&2
  exit 1
fi
if ! command -v cc >/dev/null; then
  echo "run-target: installing a C compiler (gcc, libc6-dev) for the TLS library's build" >&2
  apt-get update -qq && apt-get install -y -qq gcc libc6-dev >/dev/null
  cc --version >/dev/null
fi
exec cargo run --profile quick-release --bin rsv -- target "$@"
