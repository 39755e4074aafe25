#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for RUNS executions (default 10,000,000) or
# MAX_SECONDS (default 3600), whichever comes first, one after another, and prints per
# target the executions, the rate, and libFuzzer's last coverage figures (cov: edges,
# ft: features, corp: corpus entries). New inputs land in fuzz/corpus/TARGET; the corpus
# is minimized afterwards (cargo fuzz cmin). A crash stops that target and is reported
# with its artifact (fuzz/artifacts/TARGET/). Not a test: long. Needs nightly Rust and
# cargo-fuzz (cargo install cargo-fuzz).
#   scripts/fuzz-all.sh [TARGET...]
#   RUNS=1000000 MAX_SECONDS=600 NICE=15 scripts/fuzz-all.sh pdu_decode
#
# Built optimized with debug assertions and overflow checks (-a, cargo-fuzz's default:
# arithmetic overflow, which a release build wraps silently, is a crash here) but without
# AddressSanitizer (-s none): the code fuzzed (iscsi, isns, scsi, backstore's RAM store,
# media's and replicate's HTTP parsing and the control channel's authentication, timing's
# capture reading and analysis, rbd's parsers of what gateways write to the cluster, built
# without librados) has no unsafe block, so ASan would find nothing Rust does not, at a
# cost of executions a second.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
RUNS=${RUNS:-10000000}
MAX_SECONDS=${MAX_SECONDS:-3600}
NICE=${NICE:-15}
FLAGS=(-s none -a)
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
logs=${LOGS:-$(mktemp -d /tmp/rsv-fuzz.XXXXXX)}
nice -n "$NICE" cargo +nightly fuzz build "${FLAGS[@]}" >&2
printf '%-12s %12s %8s %10s %8s %8s %6s  %s\n' target execs seconds execs/s cov ft corp result
status=0
for t in "${targets[@]}"; do
  log="$logs/$t.log"
  set +e
  nice -n "$NICE" cargo +nightly fuzz run "${FLAGS[@]}" "$t" -- \
    -runs="$RUNS" -max_total_time="$MAX_SECONDS" -print_final_stats=1 > "$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<< "$last")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then result=ok; else result="CRASH (exit $rc, see $log)"; status=1; fi
  printf '%-12s %12s %8s %10s %8s %8s %6s  %s\n' "$t" "${execs:-?}" "${secs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
  nice -n "$NICE" cargo +nightly fuzz cmin "${FLAGS[@]}" "$t" > "$logs/$t.cmin.log" 2>&1 || true
done
echo "logs in $logs" >&2
exit $status
