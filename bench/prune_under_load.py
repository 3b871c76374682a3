"""How fast the scheduled retention prunes, and how much it delays writers meanwhile.

Start a server on a manual clock whose maintenance only prunes, a pass every 200 ms:

    target/release/flightlog serve --db /tmp/prune.db --addr 127.0.0.1:PORT --grpc-addr off \
        --manual-clock --maintenance-every-ms 200 --prune-after-ms 86400000 \
        --stale-after-ms off --stuck-after-ms off

then

    python3 bench/prune_under_load.py PORT [RUNS] [SPANS] [WRITERS] [BASELINE_SECONDS] [BATCH]

It records RUNS ended runs (default 20,000) of SPANS spans each (default 10: a root and its
children, one event each), rolled up, all ended at t = 2,000 ms; times WRITERS clients
(default 2) doing single-op writes (start a span, end it) for BASELINE_SECONDS (default 5)
with nothing to prune; then moves the clock a day on, so that every run is past the retention,
and times the same writers until `flightlog_maintenance_runs_pruned_total` reaches RUNS. It
prints the prune's rate (runs/s, spans/s) and the writers' per-write latency (p50, p99, max) in
both phases.

With BATCH, the prune is the endpoint's instead (start the server with `--maintenance-every-ms
off`): after the clock move, `POST /v1/activity/maintenance/prune` with `batch` BATCH (at most
10,000) is called until every run is pruned, each call timed.
"""
import http.client
import json
import sys
import threading
import time

port = int(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
spans = int(sys.argv[3]) if len(sys.argv) > 3 else 10
n_writers = int(sys.argv[4]) if len(sys.argv) > 4 else 2
baseline_secs = float(sys.argv[5]) if len(sys.argv) > 5 else 5
endpoint_batch = int(sys.argv[6]) if len(sys.argv) > 6 else None
DAY = 86_400_000


def connect():
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def call(conn, method, path, body=None):
    payload = None if body is None else json.dumps(body)
    headers = {"content-type": "application/json"} if payload is not None else {}
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: {response.status} {data[:300]!r}")
    return json.loads(data) if data else None


def metric(conn, name):
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


def fill(conn):
    ops_per_request = 400
    ops = []

    def flush():
        if ops:
            result = call(conn, "POST", "/v1/activity/batch", {"ops": ops})
            bad = [r for r in result["results"] if isinstance(r, dict) and "error" in r]
            if bad:
                raise SystemExit(f"batch refused: {bad[:3]}")
            ops.clear()

    for r in range(runs):
        run = f"old-run-{r}"
        root = f"{run}-0"
        ops.append({"op": "startSpan", "spanId": root, "runId": run, "name": "turn",
                    "kind": "turn", "origin": "session", "startedAt": 1_000})
        for s in range(1, spans):
            ops.append({"op": "startSpan", "spanId": f"{run}-{s}", "runId": run,
                        "parentSpanId": root, "name": "tool", "kind": "tool",
                        "origin": "session", "startedAt": 1_000 + s})
            ops.append({"op": "appendEvent", "spanId": f"{run}-{s}", "eventType": "output",
                        "payload": {"text": "x" * 200}, "ts": 1_100 + s})
            ops.append({"op": "endSpan", "spanId": f"{run}-{s}", "outcome": "success",
                        "endedAt": 1_500 + s})
            if len(ops) >= ops_per_request:
                flush()
        ops.append({"op": "endSpan", "spanId": root, "outcome": "success", "endedAt": 2_000,
                    "usage": {"inputTokens": 1000, "outputTokens": 100, "costUsd": 0.01}})
        if len(ops) >= ops_per_request:
            flush()
    flush()
    for r in range(runs):
        call(conn, "POST", f"/v1/activity/runs/old-run-{r}/rollup")


def writer(index, until, latencies, lock):
    conn = connect()
    i = 0
    while not until():
        sid = f"live-{index}-{i}-{time.time_ns()}"
        began = time.perf_counter()
        call(conn, "POST", "/v1/activity/spans",
             {"spanId": sid, "runId": sid, "name": "turn", "kind": "turn", "origin": "session"})
        call(conn, "POST", f"/v1/activity/spans/{sid}/end", {"outcome": "success"})
        with lock:
            latencies.append((time.perf_counter() - began) * 1000 / 2)
        i += 1


def timed(until):
    latencies, lock = [], threading.Lock()
    threads = [threading.Thread(target=writer, args=(w, until, latencies, lock))
               for w in range(n_writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies.sort()
    if not latencies:
        return "no writes"
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    return (f"{len(latencies)} writes, p50 {pick(0.5):.2f} ms, p99 {pick(0.99):.2f} ms, "
            f"max {latencies[-1]:.2f} ms")


conn = connect()
call(conn, "PUT", "/v1/testing/clock", {"now": 10_000})
began = time.time()
fill(conn)
print(f"recorded {runs} runs of {spans} spans in {time.time() - began:.1f} s")

stop_at = time.time() + baseline_secs
print("baseline (nothing to prune):", timed(lambda: time.time() >= stop_at))

before = metric(conn, "flightlog_maintenance_runs_pruned_total")
spans_before = metric(conn, "flightlog_maintenance_spans_pruned_total")
call(conn, "PUT", "/v1/testing/clock", {"now": 2_000 + DAY + 1})
moved = time.time()
done = {"at": None}


def prune_by_endpoint():
    pruner = connect()
    total = 0
    while total < runs and time.time() - moved < 600:
        began = time.perf_counter()
        result = call(pruner, "POST", "/v1/activity/maintenance/prune",
                      {"digestFloorAt": 0, "hardCeilingMs": DAY, "batch": endpoint_batch})
        total += result["runsPruned"]
        print(f"  prune call: {result['runsPruned']} runs, {result['spansDeleted']} spans in "
              f"{(time.perf_counter() - began) * 1000:.0f} ms")
        if result["runsPruned"] == 0:
            break
    done["at"] = time.time()


def watch():
    if endpoint_batch is not None:
        return prune_by_endpoint()
    watcher = connect()
    while time.time() - moved < 600:
        if metric(watcher, "flightlog_maintenance_runs_pruned_total") - before >= runs:
            done["at"] = time.time()
            return
        time.sleep(0.05)
    done["at"] = time.time()


watcher_thread = threading.Thread(target=watch)
watcher_thread.start()
during = timed(lambda: done["at"] is not None)
watcher_thread.join()
elapsed = (done["at"] or time.time()) - moved
if endpoint_batch is None:
    pruned = metric(conn, "flightlog_maintenance_runs_pruned_total") - before
    spans_pruned = metric(conn, "flightlog_maintenance_spans_pruned_total") - spans_before
    print(f"pruned {pruned:.0f} runs ({spans_pruned:.0f} spans) in {elapsed:.1f} s from the "
          f"clock move (passes every 200 ms, at most 2 s of pruning each): "
          f"{pruned / elapsed:.0f} runs/s, {spans_pruned / elapsed:.0f} spans/s")
print("during the prune:", during)
