"""Compressed OTLP bodies that state a false size: one protobuf export of SPANS spans (each a
200-byte name, so it compresses about 70 times) as plain gzip, as gzip ending in an empty member
(its trailer says 0), and as deflate; each form sent CLIENTS times at once to a server. Prints
each form's statuses and the server's peak RSS (VmHWM, so start a fresh server per form for a
per-form peak). The request budget counts what a body inflates to by inflating it, so with the
default 64 MiB one 52 MB export is handled at a time whatever its wrapping.

    pip install opentelemetry-proto
    flightlog serve --db bombs.db --addr 127.0.0.1:19739 --grpc-addr off & echo $! > server.pid
    python3 bench/compressed_exports.py 19739 "$(cat server.pid)" 200000 6 mm-gzip
"""
import gzip, os, sys, threading, urllib.error, urllib.request, zlib
from collections import Counter

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

port, pid, spans, clients = (int(arg) for arg in sys.argv[1:5])
form = sys.argv[5] if len(sys.argv) > 5 else "mm-gzip"

request = ExportTraceServiceRequest()
scope = request.resource_spans.add().scope_spans.add()
trace_id, root = os.urandom(16), os.urandom(8)
for n in range(spans):
    span = scope.spans.add()
    span.trace_id, span.span_id, span.parent_span_id = trace_id, n.to_bytes(8, "big"), root
    span.name = "x" * 200
    span.start_time_unix_nano = 1_700_000_000_000_000_000
    span.end_time_unix_nano = 1_700_000_000_100_000_000
raw = request.SerializeToString()
body, encoding = {
    "gzip": (gzip.compress(raw, 9), "gzip"),
    "mm-gzip": (gzip.compress(raw, 9) + gzip.compress(b"", 9), "gzip"),
    "deflate": (zlib.compress(raw, 9), "deflate"),
}[form]

statuses = []


def send():
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces",
        data=body,
        headers={"content-type": "application/x-protobuf", "content-encoding": encoding},
    )
    try:
        statuses.append(urllib.request.urlopen(req, timeout=100).status)
    except urllib.error.HTTPError as error:
        statuses.append(error.code)


threads = [threading.Thread(target=send) for _ in range(clients)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with open(f"/proc/{pid}/status") as status:
    peak = next(line.split()[1] for line in status if line.startswith("VmHWM"))
print(f"{form}: {len(raw)} bytes, {len(body)} sent, {clients} at once: "
      f"statuses {dict(Counter(statuses))}; server peak RSS {int(peak) // 1024} MiB")
