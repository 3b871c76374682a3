#!/usr/bin/env bash
# Single-op HTTP writes of flightlog and of the reference store served by Bun, measured side by
# side: ROUNDS rounds, each a machine probe, then `flightlog-loadgen http --phases single` against
# flightlog (FL_RUNS runs of 28 writes) and against bench/reference_http/flightlog-reference
# (REF_RUNS runs), the two orders alternating from round to round. The machine is a shared VM
# whose speed swings by half within minutes; a round's two figures share its phase, so their
# ratio says what flightlog's figure alone cannot (issue 4's target, 50,000 writes/s, is 6.8 times
# the reference's 7,300 measured when the target was set). One line a round; the loadgen's
# whole output goes to LOG_DIR (default bench-logs/side-by-side-<commit>-<time>).
#
#     bench/side_by_side.sh [ROUNDS=6] [FL_RUNS=4000] [REF_RUNS=1000] [SERVER]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-6}
fl_runs=${2:-4000}
ref_runs=${3:-1000}
server=${4:-target/release/flightlog}
reference=bench/reference_http/flightlog-reference
log_dir=${LOG_DIR:-bench-logs/side-by-side-$(git rev-parse --short HEAD)-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$log_dir"

cargo build --release -q -p flightlog -p flightlog-loadgen
loadgen=target/release/flightlog-loadgen

measure() { # BINARY RUNS LOG
  "$loadgen" --server "$1" http --phases single --runs "$2" >"$3" 2>"$3.err" || true
}

for round in $(seq 1 "$rounds"); do
  prefix="$log_dir/round$round"
  stamp=$(date -u +%H:%M:%S)
  "$loadgen" machine >"$prefix-machine.log" 2>&1
  if [ $((round % 2)) -eq 1 ]; then
    measure "$server" "$fl_runs" "$prefix-flightlog.log"
    sleep 2
    measure "$reference" "$ref_runs" "$prefix-reference.log"
  else
    measure "$reference" "$ref_runs" "$prefix-reference.log"
    sleep 2
    measure "$server" "$fl_runs" "$prefix-flightlog.log"
  fi
  python3 - "$prefix" "$round" "$stamp" <<'PY'
import json, re, sys
prefix, round_, stamp = sys.argv[1:]
def phase(name):
    try:
        last = open(f"{prefix}-{name}.log").read().strip().splitlines()[-1]
        single = json.loads(last)["phases"]["single-op"]
        return single["throughput"], single["serverCpuUsPerUnit"], single["errors"] + single["violations"]
    except (OSError, IndexError, KeyError, ValueError):
        return None
probe = re.search(r"([\d.]+) ns a random memory load", open(f"{prefix}-machine.log").read())
fl, ref = phase("flightlog"), phase("reference")
def show(figures):
    return "failed (see the log)" if figures is None else \
        f"{figures[0]:,.0f} writes/s ({figures[1]:.1f} us server CPU a write, {figures[2]} errors)"
ratio = f"{fl[0] / ref[0]:.2f}x" if fl and ref and ref[0] > 0 else "-"
print(f"round {round_} {stamp} | memory ns {probe.group(1) if probe else '?'} | "
      f"flightlog {show(fl)} | reference {show(ref)} | ratio {ratio}", flush=True)
PY
  sleep 2
done
echo "logs: $log_dir"
