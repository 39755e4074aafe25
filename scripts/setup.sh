#!/usr/bin/env bash
# Installs what Reservoir's run and test commands need on a Debian machine (as root), then
# checks that every tool works, not only that it is installed.
#
#   scripts/setup.sh           install what is missing or broken, then check everything
#   scripts/setup.sh --check   install nothing: check everything, exit 1 if anything fails
#
# Idempotent: when every check passes it calls neither apt nor the network.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
export PATH="$PATH:/usr/sbin:/sbin"

# Runs a check quietly; on failure keeps its output for the report.
quiet() { "$@" >"$scratch/out" 2>&1; }
# The last lines of the last check's output, indented, for a report.
why() { tail -n 3 "$scratch/out" 2>/dev/null | sed 's/^/      /'; }
# N ports on 127.0.0.1 that the kernel says are free now (bound to port 0, then let go):
# a check must not collide with what another run or a lab left listening.
free_ports() {
  python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# --- the checks: each proves a tool does its job here ------------------------------------

# A server started in the background (PID, its output in LOG) is probed: PROBE... runs up
# to TRIES times, PAUSE seconds apart, until it succeeds (0) or the server ends (1, its LOG
# in $scratch/out); then the server is stopped.
probe_server() {
  local pid=$1 log=$2 tries=$3 pause=$4 i rc=1
  shift 4
  for i in $(seq "$tries"); do
    if "$@"; then
      rc=0
      break
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$log" >"$scratch/out"; break; }
    sleep "$pause"
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return "$rc"
}

# Runs CMD... as a server in a network namespace NS of its own (loopback up, its output in
# LOG) and probes it (probe_server, 50 times 0.2 s apart) with PROBE; NS is deleted after.
probe_in_ns() {
  local ns=$1 log=$2 probe=$3 pid rc=0
  shift 3
  quiet ip netns add "$ns" || return 1
  ip -n "$ns" link set lo up >/dev/null 2>&1
  ip netns exec "$ns" "$@" >"$log" 2>&1 &
  pid=$!
  probe_server "$pid" "$log" 50 0.2 "$probe" || rc=1
  ip netns del "$ns" >/dev/null 2>&1 || true
  return "$rc"
}

check_libiscsi() {
  # The suite must list its tests, and each client must at least parse its arguments.
  quiet iscsi-test-cu --list && grep -q '^SCSI\.' "$scratch/out" || return 1
  local tool
  for tool in iscsi-ls iscsi-inq iscsi-perf; do
    command -v "$tool" >"$scratch/out" 2>&1 || return 1
  done
}

check_libiscsi_dev() {
  # The LUN-masking walk (tests/masking.rs) builds a libiscsi client of its own: a program
  # that makes a context and a task must compile, link and run.
  cat >"$scratch/li.c" <<'C'
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
int main(void) {
  struct iscsi_context *c = iscsi_create_context("iqn.2026-11.org.reservoir:setup");
  unsigned char cdb[6] = {0};
  struct scsi_task *t = scsi_create_task(6, cdb, SCSI_XFER_NONE, 0);
  if (!c || !t) return 1;
  scsi_free_scsi_task(t);
  iscsi_destroy_context(c);
  return 0;
}
C
  quiet cc -o "$scratch/li" "$scratch/li.c" -liscsi && quiet "$scratch/li"
}

check_systemd_analyze() {
  # The packaged units (packaging/systemd) are verified and scored with it (tests/service.rs).
  quiet systemd-analyze --version && grep -q '^systemd [0-9]' "$scratch/out"
}

check_debhelper() {
  # tests/package.rs builds the Debian package (debian/) with dpkg-buildpackage and dh:
  # a package of one file, built the same way, must come out and list that file.
  local src="$scratch/deb/check"
  mkdir -p "$src/debian" && printf 'check\n' >"$src/check.txt"
  printf '%s\n' 'check (1.0) unstable; urgency=medium' '' '  * Check.' '' \
    ' -- Setup <setup@localhost>  Sun, 29 Nov 2026 12:00:00 +0000' >"$src/debian/changelog"
  printf '%s\n' 'Source: check' 'Maintainer: Setup <setup@localhost>' \
    'Build-Depends: debhelper-compat (= 13)' 'Rules-Requires-Root: no' '' 'Package: check' \
    'Architecture: all' 'Description: setup check' ' A package of one file.' >"$src/debian/control"
  printf '%s\n' '#!/usr/bin/make -f' '%:' '	dh $@' 'override_dh_auto_install:' \
    '	install -D -m 0644 check.txt debian/check/usr/share/check/check.txt' >"$src/debian/rules"
  chmod +x "$src/debian/rules"
  (cd "$src" && quiet dpkg-buildpackage -b -us -uc) || return 1
  quiet dpkg-deb -c "$scratch/deb/check_1.0_all.deb" && grep -q 'usr/share/check/check.txt' "$scratch/out"
}

check_qemu() {
  # qemu-img opens iscsi:// only through the block-iscsi module of qemu-block-extra, which
  # must be the same build as qemu-utils. Asked for a port where nothing listens, a working
  # pair fails to connect; a missing or mismatched module fails to load instead.
  quiet qemu-img --version || return 1
  quiet qemu-io --version || return 1
  quiet timeout 20 qemu-img info 'iscsi://127.0.0.1:9/iqn.2000-01.invalid:setup-check/0' && return 1
  if grep -qiE 'unable to load module|unknown protocol|unknown driver|must specify either driver' "$scratch/out"; then
    return 1
  fi
  grep -qiE 'connect|iscsi' "$scratch/out"
}

check_tgt() {
  # tgtadm and tgtd parse their options; the tests start their own tgtd on a free port.
  quiet tgtadm --help && quiet tgtd --help
}

check_iperf3() { quiet iperf3 --version; }

check_iproute2() {
  # The WAN emulator and the lab put test hosts in network namespaces joined by veth and TUN.
  quiet ip -V || return 1
  quiet tc -V || return 1
  local ns="rsv-setup-$$"
  quiet ip netns add "$ns" || return 1
  quiet ip -n "$ns" link set lo up
  local rc=$?
  ip netns del "$ns" >/dev/null 2>&1 || true
  [ "$rc" -eq 0 ] && [ -c /dev/net/tun ]
}

check_ping() { quiet ping -c 1 -W 2 127.0.0.1; }

check_open_isns() {
  # isnsd must serve: it binds 0.0.0.0:3205 whatever its configuration says, so it runs in
  # a network namespace of its own, and isnsadm registers a target there and finds it.
  quiet isnsd --version || return 1
  quiet isnsadm --version || return 1
  local ns="rsv-setup-isns-$$" dir="$scratch/isns" found=1
  mkdir -p "$dir"
  printf '%s\n' "SourceName = isns.setup.check" "SLPRegister = 0" "Security = 0" \
    "DefaultDiscoveryDomain = 1" "ESIRetries = 0" "PIDFile = $dir/isnsd.pid" \
    "ControlSocket = $dir/isnsctl" >"$dir/isnsd.conf"
  printf '%s\n' "SourceName = iqn.2026-11.org.reservoir:setup" "ServerAddress = 127.0.0.1" \
    "Security = 0" >"$dir/isnsadm.conf"
  # Registered: then the query says whether the server knows the target.
  registered() {
    ip netns exec "$ns" isnsadm -c "$dir/isnsadm.conf" --register \
      entity=setup.check portal=127.0.0.1:3260 target=iqn.2026-11.org.reservoir:setup-check \
      >"$scratch/out" 2>&1 || return 1
    ip netns exec "$ns" isnsadm -c "$dir/isnsadm.conf" --query iscsi-name >"$scratch/out" 2>&1 &&
      grep -q 'iqn.2026-11.org.reservoir:setup-check' "$scratch/out" && found=0
    return 0
  }
  probe_in_ns "$ns" "$dir/isnsd.log" registered isnsd -f -c "$dir/isnsd.conf" || return 1
  return "$found"
}

check_fuse() {
  # rsv mount serves a LUN as a file through FUSE.
  quiet fusermount3 -V && [ -c /dev/fuse ]
}

check_ext4_loop() {
  # A file system on a remote LUN: losetup over the FUSE file, then mkfs.ext4. Checked on a
  # scratch image file, without touching any device.
  quiet mkfs.ext4 -V || return 1
  truncate -s 8M "$scratch/fs.img"
  quiet mkfs.ext4 -q -F "$scratch/fs.img" || return 1
  quiet losetup --version || return 1
  quiet mount --version
}

check_ceph() {
  # The throw-away cluster of scripts/ceph-cluster.sh (monitor, OSD, their tools) and the
  # rbd store, which links librbd and librados: a one-line program calling librbd must
  # compile and link against the development files and run (starts no daemon).
  local t
  for t in ceph-mon ceph-osd ceph rbd; do
    quiet "$t" --version || return 1
    grep -q 'ceph version' "$scratch/out" || return 1
  done
  # ceph-authtool --help exits 1 after its usage.
  quiet ceph-authtool --help || true
  grep -q 'usage: ceph-authtool' "$scratch/out" || return 1
  quiet monmaptool --help || return 1
  quiet uuidgen || return 1
  quiet python3 --version || return 1
  printf '#include <rbd/librbd.h>\n#include <rados/librados.h>\nint main(void){int a,b,c,d,e,f;rbd_version(&a,&b,&c);rados_version(&d,&e,&f);return a>=1 && d>=1?0:1;}\n' \
    >"$scratch/rbd.c"
  quiet cc -o "$scratch/rbd-check" "$scratch/rbd.c" -lrbd -lrados || return 1
  quiet "$scratch/rbd-check" || return 1
  # The store's C++ shim (crates/rbd/shim) reads into a ceph::bufferlist through librbd's
  # C++ API: librbd.hpp (librbd-dev) and librados' C++ headers (libradospp-dev) must
  # compile (g++), and a program that makes a bufferlist and names Image::aio_read2 must
  # link and run.
  cat >"$scratch/rbd.cc" <<'CC'
  #include <rados/buffer.h>
  #include <rbd/librbd.hpp>
  int main() {
    ceph::bufferlist bl;
    bl.append("rsv", 3);
    int (librbd::Image::*read)(uint64_t, size_t, ceph::bufferlist &, librbd::RBD::AioCompletion *, int) =
        &librbd::Image::aio_read2;
    return bl.length() == 3 && read != nullptr ? 0 : 1;
  }
CC
  quiet c++ -std=c++17 -o "$scratch/rbd-check-cc" "$scratch/rbd.cc" -lrbd -lrados || return 1
  quiet "$scratch/rbd-check-cc"
}

check_fio() {
  # fio's rbd engine (librbd directly) is the ceiling the RBD benchmarks compare with.
  quiet fio --version || return 1
  quiet fio --enghelp || return 1
  grep -qx 'rbd' <(tr -d '\t ' <"$scratch/out")
}

check_ffmpeg() {
  # rsv media's tests make a clip from test sources (VP8 + Opus in WebM) and read it back
  # over HTTP with ffprobe: a 1-second clip must encode and probe as such.
  quiet ffmpeg -loglevel error -y -f lavfi -i testsrc=duration=1:size=160x120:rate=10 \
    -f lavfi -i sine=duration=1 -c:v libvpx -c:a libopus -shortest "$scratch/clip.webm" || return 1
  quiet ffprobe -v error -show_entries stream=codec_name -of csv=p=0 "$scratch/clip.webm" || return 1
  grep -q vp8 "$scratch/out" && grep -q opus "$scratch/out"
}

check_chromium() {
  # Headless Chromium (as root: --no-sandbox) runs a page's script: the DOM it dumps holds
  # what the script wrote.
  printf '%s\n' '<!doctype html><p id="x">static</p>' \
    '<script>document.getElementById("x").textContent = "script " + (6 * 7);</script>' \
    >"$scratch/page.html"
  quiet timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --user-data-dir="$scratch/chromium" --dump-dom "file://$scratch/page.html" || return 1
  grep -q 'script 42' "$scratch/out"
}

check_curl() { quiet curl --version; }

check_fat_tools() {
  # rsv media reads FAT too: its tests make an image with mkfs.vfat and put a file in it
  # with mtools, no mount.
  truncate -s 8M "$scratch/fat.img"
  quiet mkfs.vfat "$scratch/fat.img" || return 1
  echo hello >"$scratch/hello.txt"
  quiet mcopy -i "$scratch/fat.img" "$scratch/hello.txt" ::/hello.txt || return 1
  quiet mdir -i "$scratch/fat.img" ::/ && grep -qi hello "$scratch/out"
}

check_samba() {
  # The lab's R4 reads a file from smbd (site b) with smbclient (site a): smbd must serve a
  # share in a namespace of its own and smbclient get a file from it, byte for byte.
  quiet smbd --version || return 1
  quiet smbclient --version || return 1
  local ns="rsv-setup-smb-$$" d="$scratch/smb" same=1
  mkdir -p "$d/share" "$d/state"
  head -c 100000 /dev/urandom >"$d/share/f.bin"
  printf '%s\n' '[global]' 'server role = standalone server' 'map to guest = Bad User' \
    'guest account = root' "lock directory = $d/state" "state directory = $d/state" \
    "cache directory = $d/state" "private dir = $d/state" "pid directory = $d/state" \
    "log file = $d/state/log.%m" 'disable netbios = yes' 'smb ports = 445' \
    'load printers = no' 'printing = bsd' 'printcap name = /dev/null' \
    '[s]' "path = $d/share" 'read only = yes' 'guest ok = yes' 'guest only = yes' >"$d/smb.conf"
  # Got: then the copy says whether it is the file, byte for byte.
  got() {
    ip netns exec "$ns" smbclient //127.0.0.1/s -N -s "$d/smb.conf" \
      -c "get f.bin $d/got.bin" >"$scratch/out" 2>&1 || return 1
    cmp -s "$d/share/f.bin" "$d/got.bin" && same=0
    return 0
  }
  probe_in_ns "$ns" "$d/smbd.log" got smbd --foreground --configfile="$d/smb.conf" || return 1
  return "$same"
}

check_gridftp() {
  # GridFTP, a peer of rsv-lab run r2: a server on loopback (anonymous, as the lab runs it;
  # told its host name, since a test namespace has no resolver) receives a file from
  # globus-url-copy in two parallel streams, and the copy is compared.
  # -version exits 1 after printing it.
  quiet globus-url-copy -version || true
  grep -q '^globus-url-copy: [0-9]' "$scratch/out" || return 1
  local dir port pid rc=0
  dir=$(mktemp -d /tmp/rsv-setup-gridftp.XXXXXX)
  chmod 777 "$dir"
  head -c 1048576 /dev/urandom >"$dir/src"
  chmod 644 "$dir/src"
  port=$(free_ports 1) || return 1
  GLOBUS_HOSTNAME=127.0.0.1 globus-gridftp-server -aa -anonymous-user nobody -p "$port" \
    -control-interface 127.0.0.1 -data-interface 127.0.0.1 >"$dir/server.log" 2>&1 &
  pid=$!
  copied() {
    GLOBUS_HOSTNAME=127.0.0.1 quiet globus-url-copy -p 2 "file://$dir/src" \
      "ftp://127.0.0.1:$port$dir/dst" && cmp -s "$dir/src" "$dir/dst"
  }
  probe_server "$pid" "$dir/server.log" 150 0.2 copied || rc=1
  rm -rf "$dir"
  return $rc
}

check_stunnel() {
  # stunnel must carry bytes: a client tunnel into a server tunnel (certificate made here,
  # TLS 1.3) in front of a tiny HTTP server, all on loopback, and a file fetched through.
  quiet openssl version || return 1
  local dir="$scratch/stunnel" rc=1 i pids=() http server client
  read -r http server client <<<"$(free_ports 3)" || return 1
  mkdir -p "$dir"
  quiet openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj /CN=127.0.0.1 -keyout "$dir/key.pem" -out "$dir/cert.pem" || return 1
  echo "tunnelled $$" >"$dir/probe"
  printf 'foreground = yes\npid =\n[s]\naccept = 127.0.0.1:%d\nconnect = 127.0.0.1:%d\ncert = %s\nkey = %s\nsslVersionMin = TLSv1.3\n' \
    "$server" "$http" "$dir/cert.pem" "$dir/key.pem" >"$dir/server.conf"
  printf 'foreground = yes\npid =\n[c]\nclient = yes\naccept = 127.0.0.1:%d\nconnect = 127.0.0.1:%d\n' \
    "$client" "$server" >"$dir/client.conf"
  python3 -m http.server --bind 127.0.0.1 --directory "$dir" "$http" >"$dir/http.log" 2>&1 &
  pids+=($!)
  stunnel "$dir/server.conf" >"$dir/server.log" 2>&1 &
  pids+=($!)
  stunnel "$dir/client.conf" >"$dir/client.log" 2>&1 &
  pids+=($!)
  # Until the tunnel answers, for 30 s at most (a loaded machine starts stunnel slowly).
  for i in $(seq 300); do
    if python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$client/probe', timeout=2).read().decode())" \
      >"$scratch/out" 2>&1 && grep -q "tunnelled $$" "$scratch/out"; then
      rc=0
      break
    fi
    sleep 0.1
  done
  kill "${pids[@]}" >/dev/null 2>&1 || true
  wait "${pids[@]}" >/dev/null 2>&1 || true
  [ "$rc" -eq 0 ] || cat "$dir/server.log" "$dir/client.log" >>"$scratch/out"
  return "$rc"
}

check_tshark() {
  # tshark must decode iSCSI, not only start: a one-packet capture (IPv4/TCP to port 3260
  # carrying an immediate NOP-Out with ITT 0x12345678) written here is dissected and the
  # opcode and ITT read back; tcpdump must list its interfaces (the tests capture with it).
  quiet tcpdump --version || return 1
  local dir="$scratch/tshark"
  mkdir -p "$dir"
  python3 - "$dir/nop.pcap" <<'PY' || return 1
import struct, sys
bhs = bytearray(48)
bhs[0], bhs[1] = 0x40, 0x80
bhs[16:20] = struct.pack(">I", 0x12345678)
bhs[20:24] = b"\xff\xff\xff\xff"
tcp = struct.pack(">HHIIBBHHH", 40000, 3260, 1, 1, 5 << 4, 0x18, 65535, 0, 0) + bytes(bhs)
ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0,
                 bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1])) + tcp
rec = struct.pack("<IIII", 1, 0, len(ip), len(ip)) + ip
open(sys.argv[1], "wb").write(struct.pack("<IHHiIII", 0xa1b2c3d4, 2, 4, 0, 0, 65535, 101) + rec)
PY
  tshark -r "$dir/nop.pcap" -o iscsi.target_ports:3260 -Y iscsi -T fields \
    -e iscsi.opcode -e iscsi.initiatortasktag >"$scratch/out" 2>&1 || return 1
  grep -q "^0x00[[:space:]]0x12345678" "$scratch/out"
}

check_prometheus() {
  # promtool must lint an exposition, and the server must scrape and answer PromQL: a
  # Prometheus on a free loopback port scrapes its own /metrics every second, and the
  # query up{job="self"} must come back 1 (tests/metrics.rs runs both against the target).
  printf '# HELP probe_things_total Things.\n# TYPE probe_things_total counter\nprobe_things_total 1\n' |
    quiet promtool check metrics || return 1
  local dir="$scratch/prometheus" port pid rc=0
  mkdir -p "$dir"
  port=$(free_ports 1) || return 1
  printf 'global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: self\n    static_configs:\n      - targets: [\x27127.0.0.1:%d\x27]\n' \
    "$port" >"$dir/prometheus.yml"
  prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/db" \
    --web.listen-address="127.0.0.1:$port" >"$dir/server.log" 2>&1 &
  pid=$!
  scraped() {
    python3 -c "import json, urllib.request, sys
r = json.load(urllib.request.urlopen('http://127.0.0.1:$port/api/v1/query?query=up%7Bjob%3D%22self%22%7D', timeout=2))
sys.exit(0 if [x['value'][1] for x in r['data']['result']] == ['1'] else 1)" >"$scratch/out" 2>&1
  }
  # Until a scrape is in, for 30 s at most.
  probe_server "$pid" "$dir/server.log" 300 0.1 scraped || rc=1
  rm -rf "$dir"
  return $rc
}

check_fonts() { [ -s /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]; }

check_bpf() {
  # The build compiles rsv's congestion control (crates/cc/bpf/rsv.bpf.c) with clang-14
  # against libbpf-dev's headers; the loader opens libbpf.so.1 at run time. A trivial
  # program that uses the same headers must compile to an object whose BTF bpftool reads,
  # and the library must open.
  local dir="$scratch/bpf"
  mkdir -p "$dir"
  printf '%s\n' 'typedef unsigned char __u8; typedef unsigned short __u16; typedef unsigned int __u32;' \
    'typedef int __s32; typedef unsigned long long __u64; typedef long long __s64;' \
    'typedef __u16 __be16; typedef __u32 __be32; typedef __u32 __wsum;' '#include <bpf/bpf_helpers.h>' \
    'struct { __uint(type, 2); __uint(max_entries, 1); __type(key, int); __type(value, int); } m SEC(".maps");' \
    'SEC("socket") int prog(void *ctx) { int k = 0; int *v = bpf_map_lookup_elem(&m, &k); return v ? *v : 0; }' \
    'char _license[] SEC("license") = "GPL";' >"$dir/check.bpf.c"
  quiet clang-14 -target bpf -O2 -g -c "$dir/check.bpf.c" -o "$dir/check.bpf.o" || return 1
  quiet bpftool btf dump file "$dir/check.bpf.o" || return 1
  grep -q "STRUCT" "$scratch/out" || return 1
  quiet python3 -c 'import ctypes; ctypes.CDLL("libbpf.so.1").libbpf_major_version' || return 1
  [ -r /sys/kernel/btf/vmlinux ] || { echo "no /sys/kernel/btf/vmlinux: rsv cannot load here" >"$scratch/out"; return 1; }
}

check_cargo() { quiet cargo --version; }

# name | Debian packages | what Reservoir needs it for | check
TOOLS=(
  "libiscsi's tools|libiscsi-bin|iscsi-test-cu (conformance suite) and iscsi-ls/-inq/-perf, standard clients of the target|check_libiscsi"
  "libiscsi's library|libiscsi-dev|tests/masking.rs builds a libiscsi client that sends the LUN-masking walk's CDBs|check_libiscsi_dev"
  "systemd-analyze|systemd|tests/service.rs verifies the packaged units and scores their hardening (systemd-analyze verify, security)|check_systemd_analyze"
  "dpkg-buildpackage and debhelper|dpkg-dev debhelper|tests/package.rs builds the Debian package (debian/) and installs, upgrades, removes and purges it|check_debhelper"
  "qemu-img with iscsi://|qemu-utils qemu-block-extra|qemu-img/qemu-io against iscsi:// URLs: image round trips and pattern-verified I/O|check_qemu"
  "tgt|tgt|a standard target: interop for the initiator and the peer in benchmarks|check_tgt"
  "iperf3|iperf3|the network's own ceiling through the same emulated link|check_iperf3"
  "ip, tc and network namespaces|iproute2|test hosts and the WAN emulator's sites|check_iproute2"
  "ping|iputils-ping|round-trip checks across the emulated link|check_ping"
  "open-isns|open-isns-server open-isns-utils|an iSNS server (isnsd) and client (isnsadm) for the target's registration and rsv ls isns://|check_open_isns"
  "FUSE|fuse3|rsv mount puts a LUN behind a FUSE file|check_fuse"
  "mkfs.ext4 and losetup|e2fsprogs mount|a file system on a mounted LUN|check_ext4_loop"
  "GridFTP|globus-gass-copy-progs globus-gridftp-server-progs|globus-url-copy -p N against globus-gridftp-server, a peer in rsv-lab run r2|check_gridftp"
  "stunnel|stunnel4 openssl python3|TLS tunnels for peers that speak no TLS: libiscsi and qemu-img to a TLS portal, rsv to tgt behind one|check_stunnel"
  "tshark and tcpdump|tshark tcpdump python3|captures and Wireshark's iSCSI dissector: rsv-lab timing's PDU decoding is checked against it (tests/timing.rs)|check_tshark"
  "DejaVu fonts|fonts-dejavu-core|the lab draws its plots with them|check_fonts"
  "ffmpeg and ffprobe|ffmpeg|rsv media's tests make a clip from test sources and probe it over HTTP|check_ffmpeg"
  "headless Chromium|chromium|rsv media's tests play a clip in the player page and take a screenshot|check_chromium"
  "curl|curl|rsv media's tests ask for byte ranges|check_curl"
  "Prometheus and promtool|prometheus python3|tests/metrics.rs: promtool check metrics lints the target's exposition; a Prometheus server scrapes it during rsv bench and its PromQL rate is compared with the bench's|check_prometheus"
  "FAT tools|dosfstools mtools|rsv media's tests read a FAT image made without a mount|check_fat_tools"
  "Samba|samba smbclient|the lab's R4 compares Reservoir with smbd read by smbclient|check_samba"
  "clang-14, libbpf and bpftool|clang-14 libbpf-dev libbpf1 bpftool|the build compiles rsv, Reservoir's BPF congestion control (crates/cc), and its loader opens libbpf.so.1|check_bpf"
  "Ceph and librbd|ceph-mon ceph-osd ceph-common librbd-dev libradospp-dev g++ uuid-runtime|the rbd store links librbd (its C++ shim needs librados' C++ headers and a C++ compiler); its tests start a throw-away cluster (scripts/ceph-cluster.sh)|check_ceph"
  "fio with its rbd engine|fio|librbd's own speed beside Reservoir's in scripts/bench-rbd.sh and scripts/ab-rbd.sh|check_fio"
)

failing=()  # indices into TOOLS
run_checks() {
  failing=()
  local i name pkgs need check
  for i in "${!TOOLS[@]}"; do
    IFS='|' read -r name pkgs need check <<<"${TOOLS[$i]}"
    if ! "$check"; then failing+=("$i"); fi
  done
}

report_failing() {
  local i name pkgs need check
  for i in "${failing[@]}"; do
    IFS='|' read -r name pkgs need check <<<"${TOOLS[$i]}"
    echo "setup: NOT WORKING: $name (Debian: $pkgs): $need" >&2
    "$check" >/dev/null 2>&1 || true
    why >&2
  done
}

# The newest version that the configured repositories offer for both qemu packages. The
# installed qemu-utils is kept when its own module can be had; otherwise the pair is
# installed at the version found here, downgrading qemu-utils if need be (a backported
# qemu-utils without a repository behind it has no matching qemu-block-extra).
qemu_pair_version() {
  local installed best="" v
  installed=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
  local block utils
  block=$(apt-cache madison qemu-block-extra 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}')
  utils=$(apt-cache madison qemu-utils 2>/dev/null | awk -F'|' '{gsub(/ /, "", $2); print $2}')
  if [ -n "$installed" ] && grep -qxF -- "$installed" <<<"$block"; then
    echo "$installed"
    return
  fi
  for v in $block; do
    grep -qxF -- "$v" <<<"$utils" || continue
    if [ -z "$best" ] || dpkg --compare-versions "$v" gt "$best"; then best=$v; fi
  done
  echo "$best"
}

install_failing() {
  local i name pkgs need check plain=() qemu=0 p
  for i in "${failing[@]}"; do
    IFS='|' read -r name pkgs need check <<<"${TOOLS[$i]}"
    for p in $pkgs; do
      case "$p" in
        qemu-utils | qemu-block-extra) qemu=1 ;;
        *) plain+=("$p") ;;
      esac
    done
  done
  echo "setup: updating the package lists" >&2
  apt-get update -qq
  # iperf3 asks whether to start a daemon; answer no.
  echo "iperf3 iperf3/start_daemon boolean false" | debconf-set-selections 2>/dev/null || true
  if [ "${#plain[@]}" -gt 0 ]; then
    echo "setup: installing ${plain[*]}" >&2
    apt-get install -y -qq --no-install-recommends "${plain[@]}" >"$scratch/apt.log" 2>&1 ||
      { tail -n 20 "$scratch/apt.log" >&2; echo "setup: apt-get install ${plain[*]} failed" >&2; exit 1; }
  fi
  if [ "$qemu" -eq 1 ]; then
    local v
    v=$(qemu_pair_version)
    if [ -z "$v" ]; then
      echo "setup: no version of qemu-block-extra in the configured repositories matches an installable qemu-utils." >&2
      echo "       qemu-img needs the module block-iscsi.so from qemu-block-extra of exactly its own version." >&2
      echo "       Add Debian's main repository (e.g. 'deb http://deb.debian.org/debian bookworm main')" >&2
      echo "       to /etc/apt/sources.list, or install qemu-block-extra built for the installed qemu-utils," >&2
      echo "       then run this script again." >&2
      apt-cache policy qemu-utils qemu-block-extra >&2 || true
      exit 1
    fi
    local now
    now=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || echo none)
    echo "setup: installing qemu-utils and qemu-block-extra $v (qemu-utils was $now)" >&2
    apt-get install -y -qq --no-install-recommends --allow-downgrades \
      "qemu-utils=$v" "qemu-block-extra=$v" >"$scratch/apt.log" 2>&1 ||
      { tail -n 20 "$scratch/apt.log" >&2; echo "setup: apt-get install qemu-utils=$v qemu-block-extra=$v failed" >&2; exit 1; }
  fi
}

# Sourced (by tests/setup.rs), the script only defines its functions.
if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then return 0; fi

mode=install
case "${1:-}" in
  "") ;;
  --check) mode=check ;;
  -h | --help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "setup: unknown option '$1' (see scripts/setup.sh --help)" >&2; exit 2 ;;
esac

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

if ! check_cargo; then
  echo "setup: cargo not found: install Rust with rustup (https://rustup.rs) first" >&2
  exit 1
fi

run_checks
if [ "${#failing[@]}" -eq 0 ]; then
  echo "setup: all ${#TOOLS[@]} tools present and working; nothing to install" >&2
  exit 0
fi
if [ "$mode" = check ]; then
  report_failing
  echo "setup: ${#failing[@]} of ${#TOOLS[@]} tools missing or broken; run scripts/setup.sh as root to install them" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  report_failing
  echo "setup: need root to install what is missing (run as root, or sudo scripts/setup.sh)" >&2
  exit 1
fi

install_failing
run_checks
if [ "${#failing[@]}" -gt 0 ]; then
  report_failing
  echo "setup: ${#failing[@]} of ${#TOOLS[@]} tools still not working after installing; see above" >&2
  exit 1
fi
echo "setup: all ${#TOOLS[@]} tools present and working" >&2
