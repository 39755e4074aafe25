# Sourced by the benchmark scripts: Reservoir's target and tgt on loopback, each serving one
# file LUN from $work (rsv.img and tgt.img, made by the caller), and their clean stop.
#
#   peers_work PREFIX  makes $work (a directory in /dev/shm, named after PREFIX) and the EXIT
#                      trap that stops the peers and removes it
#   start_peers NAME   needs RSV and work; sets RSV_URL, TGT_URL (LUN 0 and LUN 1);
#                      RSV_TARGET_TOML (optional) is appended to the target's configuration,
#                      e.g. '[threads]\nplacement = "shared"' to compare threading models
#   stop_peers         for the caller's EXIT trap; tgtd ignores SIGTERM, so it is stopped
#                      through tgtadm, then SIGKILL if it lingers
#   with_cpu PID CMD…  runs CMD; writes "initiator-cpu-s target-cpu-s wall-s" to $work/cpu:
#                      CMD's own CPU seconds (its children's rusage), the target process's
#                      (/proc/PID/stat, all its threads), and the wall time
#   flame NAME PID CMD…  runs CMD under `perf record` (call graphs from DWARF), the target
#                      PID recorded beside it, and writes NAME-initiator.svg and
#                      NAME-target.svg to $FLAME_DIR with inferno (installed by cargo if
#                      missing); FLAME (default 1; 0: none) and FLAME_DIR (default
#                      lab/bench/flame) are the callers' to read

. scripts/lib.sh
FLAME=${FLAME:-1}
FLAME_DIR=${FLAME_DIR:-lab/bench/flame}
rsv_pid=
tgt_pid=
cport=$((100 + RANDOM % 1000))

peers_work() {
  work=$(mktemp -d "/dev/shm/$1.XXXXXX")
  trap 'stop_peers; rm -rf "$work"' EXIT
}

start_peers() {
  local name=$1 rport tport
  target_toml "iqn.2026-11.org.reservoir:$name" 'backstore = "file"' "path = \"$work/rsv.img\"" \
    "$(printf '%b' "${RSV_TARGET_TOML:-}")" >"$work/rsv.toml"
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

with_cpu() { # target-pid command...
  local pid=$1
  shift
  python3 - "$pid" "$work/cpu" "$@" <<'PY'
import os, resource, subprocess, sys, time
pid, out, cmd = sys.argv[1], sys.argv[2], sys.argv[3:]
tick = os.sysconf("SC_CLK_TCK")
def target_cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick  # utime, stime
t0, c0 = time.monotonic(), target_cpu()
r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
rc = subprocess.call(cmd)
wall = time.monotonic() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
init = ru.ru_utime + ru.ru_stime - r0.ru_utime - r0.ru_stime
open(out, "w").write(f"{init:.3f} {target_cpu() - c0:.3f} {wall:.3f}\n")
sys.exit(rc)
PY
}

# CPU seconds per GiB: cpu-seconds, IOPS, I/O size, seconds measured.
per_gib() { python3 -c "b=$2*$3*$4; print(f'{$1/(b/2**30):.3f}' if b else 'n/a')"; }

need_inferno() {
  command -v inferno-flamegraph >/dev/null && return 0
  echo "installing inferno (flame graphs) with cargo" >&2
  cargo install --locked inferno >/dev/null 2>&1 || { echo "cargo install inferno failed: no flame graphs" >&2; return 1; }
}

flame() { # name target-pid command...
  local name=$1 pid=$2
  shift 2
  need_inferno || return 0
  mkdir -p "$FLAME_DIR"
  perf record -q -F 199 --call-graph dwarf,16384 -o "$work/tgt.perf" -p "$pid" >/dev/null 2>&1 &
  local rec=$!
  sleep 0.3
  perf record -q -F 199 --call-graph dwarf,16384 -o "$work/init.perf" -- "$@" >/dev/null 2>&1 || true
  kill -INT "$rec" 2>/dev/null
  wait "$rec" 2>/dev/null || true
  for side in init tgt; do
    local svg=$FLAME_DIR/$name-$([ $side = init ] && echo initiator || echo target).svg
    perf script -i "$work/$side.perf" 2>/dev/null | inferno-collapse-perf 2>/dev/null |
      inferno-flamegraph --title "$name, $([ $side = init ] && echo initiator || echo target)" \
        --width 1200 --minwidth 2 >"$svg" 2>/dev/null || rm -f "$svg"
    rm -f "$work/$side.perf"
  done
}
