"""Idle engagement streams beside paced activity writes (BENCHMARKS.md, stop 55): K clients
follow K engagements nobody appends to while 2 writers start spans, one request and one commit
each, at a paced RATE a second in all for SECONDS; the server's CPU in that time, against the
same with no stream, and the writes reached. Before stop 55 every commit rang the journal's
doorbell and the streams' hub read the head of every followed engagement at each ring (at most
25 a second); what an idle engagement stream costs is the difference.

Usage: python3 bench/streams/idle_engagement_streams_activity_writes.py K RATE SECONDS
(e.g. `3000 1000 8`; the clients' sockets need `ulimit -n` above K). FLBIN names the server
binary. Serves on 127.0.0.1:18545."""
import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sse_client import *
PORT = 18545
K, RATE, SECS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
WRITERS = 2

def follow(setup, i):
    status, _ = setup.append(f"idle-{i}", "note", 1, {"from": "a", "text": "hello"})
    assert status == 201, status
    return f"/v1/engagements/idle-{i}/stream"

for streams in (0, K, 0):
    streams_beside_span_writes(PORT, "idle engagement streams", streams, follow, "journal",
                               WRITERS, RATE, SECS)
