#!/usr/bin/env bash
# A throw-away single-host Ceph cluster for tests and benchmarks: one monitor, one OSD, a
# pool `rbd` initialised for RBD. No systemd, cephadm, containers or mgr (librbd I/O needs
# none); everything (config, keyrings, data, sockets, pid files, logs) lives under DIR.
#
#   scripts/ceph-cluster.sh start DIR [--bluestore]   start; prints CONF=DIR/ceph.conf
#   scripts/ceph-cluster.sh stop DIR                  stop the daemons (DIR is kept)
#   scripts/ceph-cluster.sh kill-osd DIR              SIGKILL the OSD (a crash)
#   scripts/ceph-cluster.sh start-osd DIR             start the OSD again on its data
#   scripts/ceph-cluster.sh status DIR                the monitor's view (`ceph -s`)
#
# The OSD keeps its data in memory (memstore) unless --bluestore is given: then on a 4 GiB
# sparse file in DIR, so that it survives kill-osd. Memstore loses everything when its OSD
# dies; it grows to about twice the data written. The monitor listens on a free port (msgr2
# only), or CEPH_MON_PORT, of 127.0.0.1, or of CEPH_ADDR (an address of the network namespace
# the script runs in: a cluster behind an emulated link). Clients use `-c DIR/ceph.conf`
# (admin keyring DIR/keyring); `rsv target` stores: `rbd:rbd/IMAGE?conf=DIR/ceph.conf`.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "ceph-cluster: $*" >&2; exit 1; }

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { usage >&2; exit 2; }
case "$cmd" in -h | --help) usage; exit 0 ;; esac
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
conf="$dir/ceph.conf"

# Whether the process in pid file $1 still runs (a zombie left for a slow reaper does not).
running() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(cat "$1")
  [ -r "/proc/$pid/stat" ] || return 1
  # Field 3 of /proc/PID/stat, after the parenthesised command name, is the state.
  local state
  state=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
  [ "$state" != Z ] && [ "$state" != X ]
}

# Sends signal $2 to the daemon of pid file $1 and waits (up to $3 s) until it is gone.
stop_daemon() {
  local pidf=$1 sig=$2 limit=${3:-20} i
  running "$pidf" || return 0
  kill -s "$sig" "$(cat "$pidf")" 2>/dev/null || true
  for ((i = 0; i < limit * 20; i++)); do
    running "$pidf" || { rm -f "$pidf"; return 0; }
    sleep 0.05
  done
  kill -s KILL "$(cat "$pidf")" 2>/dev/null || true
  sleep 0.2
  rm -f "$pidf"
}

ceph_() { timeout 60 ceph -c "$conf" "$@"; }

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# Starts a daemon in the foreground mode (-f) in the background, its output in its log.
launch() {
  local name=$1
  shift
  setsid "$@" -f >>"$dir/log/$name.out" 2>&1 </dev/null &
  echo $! >"$dir/run/$name.pid"
  disown
}

start_osd() {
  local id
  id=$(cat "$dir/osd.id")
  running "$dir/run/osd.$id.pid" && return 0
  launch "osd.$id" ceph-osd -c "$conf" -i "$id"
  # Active by its own account (booted, in the monitor's map): clients may use it. (After
  # kill-osd the map still says up: one OSD has no peer to report it down.)
  local i
  for ((i = 0; i < 600; i++)); do
    if timeout 5 ceph --admin-daemon "$dir/run/ceph-osd.$id.asok" status 2>/dev/null |
      grep -q '"state": "active"'; then return 0; fi
    running "$dir/run/osd.$id.pid" || die "osd.$id exited; see $dir/log/osd.$id.log"
    sleep 0.1
  done
  die "osd.$id not up within 60 s; see $dir/log/osd.$id.log"
}

start() {
  local store=memstore
  case "${1:-}" in
    "") ;;
    --bluestore) store=bluestore ;;
    *) die "unknown option '$1'" ;;
  esac
  [ -e "$conf" ] && die "$dir already holds a cluster (stop it and remove the directory first)"
  # A start that fails half-way stops what it started.
  trap '[ -e "$conf" ] && stop' EXIT
  for t in ceph-mon ceph-osd ceph-authtool monmaptool ceph rbd uuidgen python3; do
    command -v "$t" >/dev/null || die "$t is not installed (scripts/setup.sh installs Ceph)"
  done
  mkdir -p "$dir/run" "$dir/log"
  local port=${CEPH_MON_PORT:-$(free_port)} addr=${CEPH_ADDR:-127.0.0.1} fsid
  fsid=$(uuidgen)
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = v2:$addr:$port
public addr = $addr
mon initial members = a
ms bind msgr1 = false
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $dir/keyring
run dir = $dir/run
pid file = $dir/run/\$name.daemon.pid
log file = $dir/log/\$name.log
crash dir = $dir/crash
log to stderr = false
err to stderr = true
mon data = $dir/\$name
osd data = $dir/\$name
osd objectstore = $store
memstore device bytes = 8589934592
bluestore block path = $dir/\$name.block
bluestore block create = true
bluestore block size = 4294967296
bluestore block db create = false
bluestore block wal create = false
bluestore cache autotune = false
bluestore cache size = 134217728
osd memory target = 939524096
osd pool default size = 1
osd pool default min size = 1
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon data avail warn = 1
mon data avail crit = 0
mon warn on pool no redundancy = false
paxos propose interval = 0.1
osd fast shutdown notify mon = false
osd op num shards = 2
osd op num threads per shard = 1
rbd default features = layering

[osd]
keyring = $dir/\$name/keyring
admin socket = $dir/run/\$cluster-\$name.asok

[mon]
keyring = $dir/\$name/keyring
admin socket = $dir/run/\$cluster-\$name.asok

[client]
# Many clients at once (targets, fio, qemu-img): a socket each.
admin socket = $dir/run/\$cluster-\$name.\$pid.\$cctid.asok
EOF
  ceph-authtool --create-keyring "$dir/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$dir/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$dir/mon.keyring" --import-keyring "$dir/keyring" >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:$addr:$port]" "$dir/monmap" >/dev/null
  mkdir -p "$dir/mon.a"
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" --keyring "$dir/mon.keyring" \
    >>"$dir/log/mkfs.out" 2>&1 || die "ceph-mon --mkfs failed; see $dir/log/mkfs.out"
  launch mon.a ceph-mon -c "$conf" -i a
  local i
  for ((i = 0; i < 300; i++)); do
    ceph_ --connect-timeout 2 mon stat >/dev/null 2>&1 && break
    running "$dir/run/mon.a.pid" || die "ceph-mon exited; see $dir/log/mon.a.log"
    sleep 0.1
  done
  ceph_ --connect-timeout 5 mon stat >/dev/null || die "the monitor does not answer; see $dir/log/mon.a.log"

  local uuid id
  uuid=$(uuidgen)
  id=$(ceph_ osd new "$uuid")
  echo "$id" >"$dir/osd.id"
  mkdir -p "$dir/osd.$id"
  ceph-osd -c "$conf" -i "$id" --mkfs --mkkey --no-mon-config --osd-uuid "$uuid" >>"$dir/log/mkfs.out" 2>&1 ||
    die "ceph-osd --mkfs failed; see $dir/log/mkfs.out"
  ceph_ auth add "osd.$id" osd 'allow *' mon 'allow profile osd' -i "$dir/osd.$id/keyring" \
    >/dev/null 2>&1 || die "registering osd.$id's key failed"
  start_osd
  ceph_ osd pool create rbd 8 8 >/dev/null 2>&1 || die "creating the pool failed"
  timeout 60 rbd -c "$conf" pool init rbd || die "rbd pool init failed"
  trap - EXIT
  echo "CONF=$conf"
}

stop() {
  [ -e "$conf" ] || die "no cluster in $dir"
  local f
  # OSDs first, so the monitor is there to hear of them; then the monitor.
  for f in "$dir"/run/osd.*.pid; do [ -e "$f" ] && stop_daemon "$f" TERM 20; done
  [ -e "$dir/run/mon.a.pid" ] && stop_daemon "$dir/run/mon.a.pid" TERM 20
  return 0
}

case "$cmd" in
  start) shift 2; start "$@" ;;
  stop) stop ;;
  kill-osd)
    id=$(cat "$dir/osd.id")
    stop_daemon "$dir/run/osd.$id.pid" KILL 20
    ;;
  start-osd) start_osd ;;
  status) ceph_ -s ;;
  *) usage >&2; exit 2 ;;
esac
