# Sourced by the benchmark scripts: Reservoir's target and tgt on loopback, each serving one
# file LUN from $work (rsv.img and tgt.img, made by the caller), and their clean stop.
#
#   start_peers NAME   needs RSV and work; sets RSV_URL, TGT_URL (LUN 0 and LUN 1)
#   stop_peers         for the caller's EXIT trap; tgtd ignores SIGTERM, so it is stopped
#                      through tgtadm, then SIGKILL if it lingers

rsv_pid=
tgt_pid=
cport=$((100 + RANDOM % 1000))

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_peers() {
  local name=$1 rport tport
  cat >"$work/rsv.toml" <<TOML
[[target]]
iqn = "iqn.2026-11.org.reservoir:$name"
[[target.lun]]
id = 0
backstore = "file"
path = "$work/rsv.img"
TOML
  rport=$(free_port)
  "$RSV" target --config "$work/rsv.toml" --listen "127.0.0.1:$rport" >"$work/rsv.out" 2>"$work/rsv.log" &
  rsv_pid=$!

  tport=$(free_port)
  tgtd -f --iscsi "portal=127.0.0.1:$tport" -C "$cport" >"$work/tgt.log" 2>&1 &
  tgt_pid=$!
  disown "$tgt_pid" # its kill -9 in stop_peers is expected; no job report for it
  for _ in $(seq 100); do
    grep -q ready "$work/rsv.out" 2>/dev/null && tgtadm -C "$cport" --mode sys --op show >/dev/null 2>&1 && break
    sleep 0.1
  done
  tgtadm -C "$cport" --lld iscsi --op new --mode target --tid 1 -T "iqn.2026-11.org.reservoir:tgt-$name"
  tgtadm -C "$cport" --lld iscsi --op new --mode logicalunit --tid 1 --lun 1 -b "$work/tgt.img"
  tgtadm -C "$cport" --lld iscsi --op bind --mode target --tid 1 -I ALL

  RSV_URL="iscsi://127.0.0.1:$rport/iqn.2026-11.org.reservoir:$name/0"
  TGT_URL="iscsi://127.0.0.1:$tport/iqn.2026-11.org.reservoir:tgt-$name/1"
}

stop_peers() {
  set +e
  [ -n "$rsv_pid" ] && kill "$rsv_pid" 2>/dev/null
  if [ -n "$tgt_pid" ]; then
    timeout 3 tgtadm -C "$cport" --lld iscsi --mode target --op delete --force --tid 1 >/dev/null 2>&1
    timeout 3 tgtadm -C "$cport" --mode system --op delete >/dev/null 2>&1
    for _ in $(seq 20); do kill -0 "$tgt_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$tgt_pid" 2>/dev/null
  fi
  [ -n "$rsv_pid" ] && { timeout 5 tail --pid="$rsv_pid" -f /dev/null || kill -9 "$rsv_pid" 2>/dev/null; }
  wait 2>/dev/null
}
