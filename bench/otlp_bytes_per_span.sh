#!/bin/bash
# Bytes on disk per OTLP span: runs `flightlog-loadgen otlp` (200,000 agent-shaped spans),
# keeps its database by hard links (the load generator deletes its temporary directory), then
# checkpoints it and divides the file's size by the spans it holds.
#
#   cargo build --release -p flightlog -p flightlog-loadgen
#   bench/otlp_bytes_per_span.sh [target/release]
set -euo pipefail
BIN=${1:-target/release}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/lg"
"$BIN/flightlog-loadgen" otlp --server "$BIN/flightlog" --tmp-dir "$WORK/lg" > "$WORK/loadgen.log" 2>&1 &
LOADGEN=$!
while kill -0 $LOADGEN 2>/dev/null; do
  for f in "$WORK"/lg/*/bench.db "$WORK"/lg/*/bench.db-wal; do
    [ -e "$f" ] || continue
    kept="$WORK/kept.db${f##*bench.db}"
    [ -e "$kept" ] || ln "$f" "$kept"
  done
  sleep 0.2
done
wait $LOADGEN
grep -E "end to end:" "$WORK/loadgen.log"
python3 - "$WORK/kept.db" <<'PY'
import os, sqlite3, sys
path = sys.argv[1]
conn = sqlite3.connect(path)
conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
spans, packed, attrs = conn.execute(
    "SELECT count(*), sum(typeof(attrs) = 'blob'), avg(length(attrs)) FROM activity_spans").fetchone()
conn.close()
size = os.path.getsize(path)
print(f"{spans} spans ({packed} with packed attrs, {attrs:.0f} B of attrs on average); "
      f"file {size} B = {size / spans:.0f} B per span")
PY
