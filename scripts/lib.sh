# Sourced by the scripts (`. scripts/lib.sh`, or `. "$(dirname "$0")/lib.sh"`): what they
# share for building rsv, starting a daemon and waiting for it, the emulated link, and the
# test image. Nothing runs on sourcing.
#
#   build_rsv [--setup] [CARGO-FLAG...]
#                      with RSV unset: `cargo build --release --bin rsv` here (honouring
#                      CARGO_TARGET_DIR) and RSV set to it; --setup runs scripts/setup.sh first
#   free_port          a free TCP port on 127.0.0.1, taken from the kernel
#   wait_ready FILE [PID]
#                      waits (up to 10 s) for a line `ready` in FILE; 1 if it never comes or
#                      PID, when given, has ended
#   start_ready OUT LOG CMD...
#                      CMD in the background (stdout to OUT, stderr to LOG; both to OUT when LOG
#                      is OUT), then wait_ready OUT; sets STARTED_PID; 1 (and LOG on stderr) if
#                      it is not ready
#   portals_of OUT     the portals a target printed to OUT (`portal ADDR` lines), one a line;
#                      with `--listen 127.0.0.1:0` the kernel has chosen the port
#   target_toml IQN [LINE... --] LINE...
#                      one [[target]] with LUN 0: the LINEs before a `--` go under the target
#                      (alias, access), the others under the LUN (its store)
#   suite_target_toml IQN PATH
#                      the target libiscsi's test suite wants: its two initiators allowed, LUN 0
#                      a thin, removable 64 MiB file at PATH
#   tls_target_toml DIR PLAIN TLS IQN SIZE
#                      a target on a plaintext portal PLAIN and a TLS 1.3 portal TLS (host:port
#                      both), data in DIR, one RAM LUN of SIZE; its certificate is made here,
#                      self-signed for TLS's address (DIR/t.crt, DIR/t.key); sets PIN to its pin
#   wan_up NAME FLAG...
#                      `$RSV_LAB wan up --name NAME --json FLAG...` after taking down a link of
#                      that name; sets WAN_JSON; wan_get EXPR prints a Python expression of v,
#                      the parsed JSON (e.g. 'v["b"]["addr"]')
#   lab_tcp NS...      the namespaces' TCP as the lab sets it: CUBIC, the kernel's default windows
#   site_key FILE      a random key (32 bytes, as hex) in FILE, readable by its owner only: what
#                      `rsv sync` and the sites' agents sign their requests with
#   site_toml ADDR DIR KEY IQN
#                      the top of a replicated site's target configuration: its portal
#                      ADDR:3260, data in DIR, the sync agent on ADDR:3262 signing with KEY, and
#                      the [[target]] IQN, whose [[target.lun]] tables the caller appends
#   site_target NS CFG OUT
#                      `rsv target --config CFG` ($RSV) in the network namespace NS, stdout to
#                      OUT.out and stderr to OUT.log, waited for until ready (start_ready: sets
#                      STARTED_PID); the script ends, saying so, if it is not
#   scratch PREFIX     $work (a directory under TMPDIR, named after PREFIX) and the EXIT trap
#                      that ends the processes in the array pids (each killed, then waited
#                      for) and removes $work
#   rbd_work PREFIX    $work (a directory under TMPDIR, named after PREFIX) and the EXIT trap
#                      that ends the processes in the array pids, stops the cluster in
#                      $work/ceph and removes $work
#   rbd_bench_image DIR MB
#                      scripts/ceph-cluster.sh's cluster started in DIR/ceph (stop it in the
#                      caller's trap), CEPH_CONF exported, and the image `bench` of MB random MB
#   cpu_of PID         CPU seconds (user + system, all threads) PID has used so far; needs TCK
#   iperf BLOCKS rand|seq [URL]
#                      iscsi-perf at queue depth 32 for SECS on URL (default $URL), 512-byte
#                      blocks per request: "IOPS MBs BYTES"
#   fio_rbd BS RW      fio's rbd engine on the image `bench` (RW: randread, read, randwrite,
#                      write), queue depth 32, for SECS: "IOPS MBs BYTES"
#   media_image DIR MIB [keep]
#                      DIR/media.img, once: an ext4 image holding movie.mp4 of MIB random MiB
#                      (and 128 MiB to spare), made from DIR/share (which keeps the file with keep)

build_rsv() {
  [ -n "${RSV:-}" ] && return 0
  if [ "${1:-}" = --setup ]; then
    shift
    ./scripts/setup.sh
  fi
  cargo build --release --bin rsv "$@" >/dev/null
  RSV=${CARGO_TARGET_DIR:-$PWD/target}/release/rsv
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

wait_ready() {
  local _
  for _ in $(seq 100); do
    grep -q '^ready' "$1" 2>/dev/null && return 0
    if [ -n "${2:-}" ] && ! kill -0 "$2" 2>/dev/null; then return 1; fi
    sleep 0.1
  done
  return 1
}

start_ready() {
  local out=$1 log=$2
  shift 2
  if [ "$out" = "$log" ]; then
    "$@" >"$out" 2>&1 &
  else
    "$@" >"$out" 2>"$log" &
  fi
  STARTED_PID=$!
  wait_ready "$out" "$STARTED_PID" || { cat "$log" >&2; return 1; }
}

portals_of() { sed -n 's/^portal //p' "$1"; }

target_toml() {
  printf '[[target]]\niqn = "%s"\n' "$1"
  shift
  if printf '%s\n' "$@" | grep -qx -- --; then
    while [ "$1" != -- ]; do
      printf '%s\n' "$1"
      shift
    done
    shift
  fi
  printf '[[target.lun]]\nid = 0\n'
  [ $# -eq 0 ] || printf '%s\n' "$@"
}

suite_target_toml() {
  cat <<TOML
[[target]]
iqn = "$1"
allowed_initiators = ["iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test", "iqn.2007-10.com.github:sahlberg:libiscsi:iscsi-test-2"]
[[target.lun]]
id = 0
backstore = "file"
path = "$2"
size = "64MiB"
removable = true
TOML
}

tls_target_toml() {
  local dir=$1 plain=$2 tls=$3
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=${tls%:*}" -addext "subjectAltName=IP:${tls%:*}" \
    -keyout "$dir/t.key" -out "$dir/t.crt" 2>/dev/null
  chmod 600 "$dir/t.key"
  PIN=sha256:$(openssl x509 -in "$dir/t.crt" -outform der | sha256sum | cut -d' ' -f1)
  printf 'portals = ["%s", { listen = "%s", tls = { cert = "%s", key = "%s" } }]\ndata_dir = "%s"\n' \
    "$plain" "$tls" "$dir/t.crt" "$dir/t.key" "$dir"
  target_toml "$4" "store = \"ram:?size=$5\""
}

wan_up() {
  local name=$1
  shift
  $RSV_LAB wan down --name "$name" >/dev/null 2>&1 || true
  WAN_JSON=$($RSV_LAB wan up --name "$name" --json "$@")
}

wan_get() { python3 -c "import json,sys;v=json.loads(sys.argv[1]);print($1)" "$WAN_JSON"; }

lab_tcp() {
  local ns
  for ns in "$@"; do
    ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_congestion_control=cubic \
      net.ipv4.tcp_wmem="4096 16384 4194304" net.ipv4.tcp_rmem="4096 131072 33554432"
  done
}

site_key() {
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$1"
  chmod 600 "$1"
}

site_toml() {
  printf 'portals = ["%s:3260"]\ndata_dir = "%s"\n[control]\nlisten = "%s:3262"\nkey_file = "%s"\n[[target]]\niqn = "%s"\n' \
    "$1" "$2" "$1" "$3" "$4"
}

site_target() {
  start_ready "$3.out" "$3.log" ip netns exec "$1" "$RSV" target --config "$2" ||
    { echo "rsv target in $1 did not start"; exit 1; }
}

scratch() {
  work=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  pids=()
  trap scratch_cleanup EXIT
}

# Every process in pids killed, then each waited for.
end_pids() {
  local p
  # `|| true`: under set -e a failed wait (a process that ended by the signal) would end
  # the cleanup before the rest of it.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

scratch_cleanup() {
  end_pids
  rm -rf "$work"
}

rbd_work() {
  scratch "$1"
  trap rbd_cleanup EXIT
}

rbd_cleanup() {
  end_pids
  scripts/ceph-cluster.sh stop "$work/ceph" >/dev/null 2>&1 || true
  rm -rf "$work"
}

rbd_bench_image() {
  scripts/ceph-cluster.sh start "$1/ceph" >/dev/null
  export CEPH_CONF="$1/ceph/ceph.conf"
  # All of the image holds data, so that reads reach the OSD rather than holes.
  head -c "${2}M" /dev/urandom >"$1/src.img"
  rbd import --no-progress "$1/src.img" bench >/dev/null
  rm -f "$1/src.img"
}

cpu_of() { awk -v t="$TCK" '{ sub(/^.*\) /, ""); printf "%.3f\n", ($12 + $13) / t }' "/proc/$1/stat"; }

# iscsi-perf prints "iops average N (M MB/s)" last; -r: random LBAs over the whole LUN.
iperf() { # blocks_per_request rand|seq [url] -> "IOPS MBs BYTES"
  local args=(-b "$1" -m 32 -t "$SECS")
  [ "$2" = rand ] && args+=(-r)
  timeout $((SECS + 20)) iscsi-perf "${args[@]}" "${3:-$URL}" 2>&1 | tr '\r' '\n' |
    grep -o 'iops average [0-9]* ([0-9]* MB/s)' | tail -1 |
    sed -E 's/iops average ([0-9]+) \(([0-9]+) MB\/s\)/\1 \2/' |
    awk -v b="$1" -v s="$SECS" '{ printf "%s %s %.0f\n", $1, $2, $1 * b * 512 * s }'
}

fio_rbd() { # bs randread|read|randwrite|write -> "IOPS MBs BYTES"
  local side=read
  case $2 in *write) side=write ;; esac
  fio --name=b --ioengine=rbd --clientname=admin --pool=rbd --rbdname=bench --rw="$2" \
    --bs="$1" --iodepth=32 --direct=1 --time_based --runtime="$SECS" --output-format=json \
    2>/dev/null | python3 -c 'import json,sys; r=json.load(sys.stdin)["jobs"][0][sys.argv[1]]; print(int(r["iops"]), int(r["bw_bytes"]/1e6), r["io_bytes"])' "$side"
}

media_image() {
  local d=$1 mib=$2
  [ -f "$d/media.img" ] && return 0
  mkdir -p "$d/share"
  head -c $((mib << 20)) /dev/urandom >"$d/share/movie.mp4"
  truncate -s $(((mib << 20) + (128 << 20))) "$d/media.img"
  mkfs.ext4 -q -F -d "$d/share" "$d/media.img"
  [ "${3:-}" = keep ] || rm "$d/share/movie.mp4"
}
