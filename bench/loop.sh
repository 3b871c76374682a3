#!/usr/bin/env bash
# The benchmark loop behind the status table of BENCHMARKS.md: SETS sets, each one run of the
# machine probe, `activity_workload`, `journal_workload --only-sqlite --repeat 3`,
# `flightlog-loadgen http`, the same single-op phase against the reference store served by Bun
# (bench/reference_http), and `flightlog-loadgen otlp`, PAUSE seconds apart. The machine is a
# shared VM whose speed swings by half within minutes, so a set's probe line says which phase
# it ran in. Each benchmark's whole output goes to LOG_DIR (default bench-logs/<commit>-<time>);
# stdout gets one summary line per set with the figures the status table takes.
#
#     bench/loop.sh [SETS] [PAUSE] [SERVER]
#
# SERVER: a flightlog binary to measure over HTTP instead of this checkout's release build (to
# compare builds in alternating sets). The in-process benchmarks always measure this checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
sets=${1:-5}
pause=${2:-5}
server=${3:-target/release/flightlog}
log_dir=${LOG_DIR:-bench-logs/$(git rev-parse --short HEAD)-$(date -u +%Y%m%dT%H%M%S)}
mkdir -p "$log_dir"

cargo build --release -q -p flightlog -p flightlog-loadgen
cargo bench -q -p flightlog-sqlite --no-run 2>/dev/null
loadgen=target/release/flightlog-loadgen

for set in $(seq 1 "$sets"); do
  stamp=$(date -u +%H:%M:%S)
  prefix="$log_dir/set$set"
  "$loadgen" machine >"$prefix-machine.log" 2>&1
  sleep "$pause"
  cargo bench -q -p flightlog-sqlite --bench activity_workload >"$prefix-activity.log" 2>&1
  sleep "$pause"
  cargo bench -q -p flightlog-sqlite --bench journal_workload -- --only-sqlite --repeat 3 \
    >"$prefix-journal.log" 2>&1
  sleep "$pause"
  "$loadgen" --server "$server" http >"$prefix-http.log" 2>"$prefix-http.err" || true
  sleep "$pause"
  # The reference store served by Bun, single-op only, right after flightlog's: the two figures
  # share the machine's phase (see bench/side_by_side.sh; "?" when there is no Bun).
  "$loadgen" --server bench/reference_http/flightlog-reference http --phases single --runs 1000 \
    >"$prefix-reference.log" 2>"$prefix-reference.err" || true
  sleep "$pause"
  "$loadgen" --server "$server" otlp >"$prefix-otlp.log" 2>"$prefix-otlp.err" || true
  sleep "$pause"
  python3 - "$prefix" "$set" "$stamp" <<'PY'
import json, re, sys
prefix, number, stamp = sys.argv[1:4]
def text(kind):
    try:
        return open(f"{prefix}-{kind}.log").read()
    except OSError:
        return ""
def last_json(kind):
    lines = [l for l in text(kind).splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else {}
def find(pattern, kind):
    m = re.search(pattern, text(kind))
    return m.group(1) if m else "?"
http, otlp = last_json("http").get("phases", {}), last_json("otlp")
rate = lambda phases, name: round(phases.get(name, {}).get("throughput", 0))
fields = [
    ("memory ns", str(last_json("machine").get("machine", {}).get("memoryNs", "?"))),
    ("activity writes/s", find(r"= (\d+) writes/s", "activity")),
    ("changes/s", find(r"page 10000\): \d+ changes in [\d.]+ s = (\d+)", "activity")),
    ("journal sqlite appends/s", find(r"one runtime thread, durability normal: best (\d+)", "journal")),
    ("1,000-event summary p50", find(r"from the file \(200 calls\): p50 ([\d.]+ ms)", "journal")),
    ("single-op", str(rate(http, "single-op"))),
    ("reference single-op", str(rate(last_json("reference").get("phases", {}), "single-op") or "?")),
    ("batch-27", str(rate(http, "batch-27ops"))),
    ("batch-216", str(rate(http, "batch-216ops"))),
    ("stream p99", find(r"stream p99 delivered - acknowledged at \d+ writes/s +([\d.]+ ms)", "http")),
    ("http RSS", find(r"server peak RSS \(max of sampled VmRSS and VmHWM\) +([\d.]+ MiB)", "http")),
    ("otlp spans/s", find(r"end to end: .* = (\d+) spans/s", "otlp")),
    ("otlp RSS", find(r"VmHWM ([\d.]+ MiB)", "otlp")),
]
reference = rate(last_json("reference").get("phases", {}), "single-op")
fields.insert(7, ("ratio", f"{rate(http, 'single-op') / reference:.2f}x" if reference else "?"))
print(f"set {number} {stamp} | " + " | ".join(f"{name} {value}" for name, value in fields))
PY
done
echo "logs: $log_dir"
