"""Run streams on quiet runs beside paced single-op writes (BENCHMARKS.md, stops 53 and 54):
K run-stream clients follow runs nobody writes while 2 writers start spans of other runs, one
request and one commit each, at a paced RATE a second in all for SECONDS; the server's CPU in
that time, against the same with no stream, and the writes reached. Each commit rang every run
stream; what a quiet run's stream costs is the difference.

Usage: python3 bench/streams/quiet_run_streams_single_writes.py K RATE SECONDS
(e.g. `200 1000 8`). FLBIN names the server binary. Serves on 127.0.0.1:18544."""
import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sse_client import *
PORT = 18544
K, RATE, SECS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
WRITERS = 2

def follow(setup, i):
    status, _ = setup.start(f"quiet-{i}", f"quiet-{i}")
    assert status == 201, status
    return f"/v1/activity/runs/quiet-{i}/stream"

for streams in (0, K, 0):
    streams_beside_span_writes(PORT, "quiet run streams", streams, follow, "change", WRITERS,
                               RATE, SECS)
