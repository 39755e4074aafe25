#!/usr/bin/env bash
# Installs what Reservoir's run and test commands need on a fresh Debian machine (as root).
# Fast when everything is already there: apt is only called for what is missing.
set -euo pipefail

# command -> Debian package that provides it
declare -A NEED=(
  [iscsi-test-cu]=libiscsi-bin
  [qemu-img]=qemu-utils
  [tgtd]=tgt
  [iperf3]=iperf3
  [ip]=iproute2
  [ping]=iputils-ping
  [isnsd]=open-isns-server
  [isnsadm]=open-isns-utils
  [fusermount3]=fuse3
  [mkfs.ext4]=e2fsprogs
  [losetup]=mount
)

missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || [ -x "/usr/sbin/$cmd" ] || [ -x "/sbin/$cmd" ] || missing+=("${NEED[$cmd]}")
done

# qemu-img reaches iscsi:// URLs through a module that qemu-block-extra ships; it must come
# from the same release as qemu-utils, so both are installed together.
if ! ls /usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so /usr/lib/*/qemu/block-iscsi.so >/dev/null 2>&1; then
  missing+=(qemu-utils qemu-block-extra)
fi

# The lab draws its plots with this font.
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)

if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # iperf3 asks whether to start a daemon; answer no.
  echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections 2>/dev/null || true
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
