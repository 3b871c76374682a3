#!/usr/bin/env bash
# One trace whose spans all lost their parents (ROOTS parentless spans in one OTLP/JSON export,
# all starting in the same millisecond), then the reads that once scanned that run once per root:
# the run list and the terminal-roots page. Prints each request's status and time.
#
#     bench/flat_trace.sh [ROOTS] [SERVER]
#
# Starts SERVER (default: this checkout's release build) on 127.0.0.1:19611 with a fresh
# database under bench-logs/flat-trace/, and stops it at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
roots=${1:-20000}
server=${2:-target/release/flightlog}
port=19611
dir=bench-logs/flat-trace
mkdir -p "$dir"
rm -f "$dir"/flat.db*
"$server" serve --db "$dir/flat.db" --addr "127.0.0.1:$port" --grpc-addr off >"$dir/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -s -o /dev/null "127.0.0.1:$port/healthz" && break
  sleep 0.1
done
python3 - "$roots" >"$dir/flat.json" <<'PY'
import json, sys
roots = int(sys.argv[1])
spans = [{"traceId": "11" * 16, "spanId": "%016x" % (i + 1), "name": "s",
          "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000001000000000"}
         for i in range(roots)]
print(json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}))
PY
curl -s -o /dev/null -w "POST /v1/traces ($roots roots) %{http_code} %{time_total}s\n" \
  -XPOST "127.0.0.1:$port/v1/traces" -H 'content-type: application/json' --data-binary @"$dir/flat.json"
for query in 'runs?limit=1' 'runs?limit=100' 'runs?state=ended&limit=10' \
             'changes/terminal-roots?limit=10000'; do
  curl -s -o /dev/null -w "GET /v1/activity/$query %{http_code} %{time_total}s\n" \
    "127.0.0.1:$port/v1/activity/$query"
done
