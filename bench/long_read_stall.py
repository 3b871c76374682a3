"""How much long reads delay everything else on a flightlog server.

LONG clients (default 4) loop on long reads (10,000 runs listed, the open roots, 10,000
changes, 10,000 terminal roots, in turn) for SECONDS while WRITERS clients (default 0) each
time single-op writes back to back (start a span, end it) and one more client times `/healthz`,
one span read, one small run's snapshot (6 spans, 10 events) and a listing of the 50 newest
runs, 10 ms apart. Run it against a server on a big database (see big_activity_db.py):

    python3 bench/long_read_stall.py PORT [SECONDS] [LONG] [WRITERS]

It prints one line per timed kind (p50, p99, max in ms) and the server's rewind counters.
"""
import json, sys, time, threading, urllib.request

port = sys.argv[1]
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 8
n_long = int(sys.argv[3]) if len(sys.argv) > 3 else 4
n_writers = int(sys.argv[4]) if len(sys.argv) > 4 else 0
base = f"http://127.0.0.1:{port}"
stop = time.time() + secs
heavy = [
    "/v1/activity/runs?limit=10000",
    "/v1/activity/open-roots",
    "/v1/activity/changes?after=0&limit=10000",
    "/v1/activity/changes/terminal-roots?after=0&limit=10000",
]
counts = [0] * 4
lat = {"healthz": [], "span": [], "small run snapshot": [], "50 newest runs": [], "write": []}
lock = threading.Lock()


def long_reads(i):
    while time.time() < stop:
        urllib.request.urlopen(base + heavy[i % 4]).read()
        with lock:
            counts[i % 4] += 1


def post(path, body):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(req).read()


def writes(w):
    i = 0
    while time.time() < stop:
        sid = f"stall-{w}-{i}-{time.time_ns()}"
        a = time.perf_counter()
        post("/v1/activity/spans", {"spanId": sid, "runId": sid, "name": "turn",
                                    "kind": "turn", "origin": "session"})
        post(f"/v1/activity/spans/{sid}/end", {"outcome": "success"})
        with lock:
            lat["write"].append((time.perf_counter() - a) * 1000 / 2)
        i += 1


def metric(name):
    text = urllib.request.urlopen(base + "/metrics").read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


rewinds0 = metric("flightlog_sqlite_wal_rewinds_total")
rewind_s0 = metric("flightlog_sqlite_wal_rewind_seconds_total")
threads = [threading.Thread(target=long_reads, args=(i,)) for i in range(n_long)]
threads += [threading.Thread(target=writes, args=(w,)) for w in range(n_writers)]
[t.start() for t in threads]
while time.time() < stop:
    for k, p in (("healthz", "/healthz"), ("span", "/v1/activity/spans/r77t2"),
                 ("small run snapshot", "/v1/activity/runs/run77/snapshot"),
                 ("50 newest runs", "/v1/activity/runs?limit=50")):
        a = time.perf_counter()
        urllib.request.urlopen(base + p).read()
        lat[k].append((time.perf_counter() - a) * 1000)
    time.sleep(0.01)
[t.join() for t in threads]
for k, v in lat.items():
    if not v:
        continue
    v.sort()
    print(k, "n", len(v), "p50 %.2f p99 %.2f max %.2f ms" % (v[len(v) // 2], v[int(len(v) * 0.99)], v[-1]))
print("heavy reads done", counts)
print("writer rewinds %d taking %.2f s" % (metric("flightlog_sqlite_wal_rewinds_total") - rewinds0,
                                         metric("flightlog_sqlite_wal_rewind_seconds_total") - rewind_s0))
