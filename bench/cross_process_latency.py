"""How long a change committed by another process on the same SQLite file takes to reach a
live stream (issue 4: within 250 ms).

Two `flightlog serve` processes share one database file. Writes go to server B; the streams
are read from server A, which learns of B's commits only through the file (its poller on the
change log, `PRAGMA data_version`). For each write: the time from B's answer (the commit) to
the event's arrival on A's stream. Writes are paced (one every PACE_MS, with jitter) so that
each one finds A's stream idle, which is the case the 250 ms is about.

    python3 bench/cross_process_latency.py [WRITES=200] [PACE_MS=40] [SERVER=target/release/flightlog] [LOAD_BATCH=0]

With LOAD_BATCH > 0, two more threads keep posting batches of that many span starts to server B
(one batch every 10 ms each) while the timed writes go on, so the reading server's stream and
checkpoints work under load; the write rate is printed.

It runs both streams in turn: the global change stream (`/v1/activity/changes/stream`, span
starts written to B) and an engagement's stream (`/v1/engagements/{id}/stream`, appends
written to B), and prints p50 / p99 / max for each.
"""
import json, os, random, socket, subprocess, sys, tempfile, threading, time, urllib.request

writes = int(sys.argv[1]) if len(sys.argv) > 1 else 200
pace_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 40.0
server = sys.argv[3] if len(sys.argv) > 3 else "target/release/flightlog"
load_batch = int(sys.argv[4]) if len(sys.argv) > 4 else 0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(db):
    port = free_port()
    process = subprocess.Popen(
        [server, "serve", "--db", db, "--addr", f"127.0.0.1:{port}", "--grpc-addr", "off"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
            return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("a server did not start")


def post(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=10).read())


def read_stream(port, path, key, arrived, ready, stop):
    """Record the arrival time of each event's `key` (from its data)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(0.5)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    buffer = b""
    ready.set()
    while not stop.is_set():
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            break
        now = time.perf_counter()
        buffer += chunk
        for line in buffer.split(b"\n")[:-1]:
            if line.startswith(b"data: "):
                try:
                    value = json.loads(line[6:])
                except ValueError:
                    continue
                found = key(value)
                if found is not None and found not in arrived:
                    arrived[found] = now
        buffer = buffer.split(b"\n")[-1]
    sock.close()


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else float("nan")


def load(port, stop, counted, worker):
    """Batches of `load_batch` span starts to `port` until `stop`."""
    n = 0
    while not stop.is_set():
        n += 1
        post(port, "/v1/activity/batch", {"ops": [
            {"op": "startSpan", "spanId": f"load-{worker}-{n}-{j}", "runId": f"load-{worker}-{n % 20}",
             "name": "tool", "kind": "tool", "origin": "session"} for j in range(load_batch)]})
        counted[worker] += load_batch
        time.sleep(0.01)


def measure(name, port_a, port_b, path, key, write):
    arrived, ready, stop = {}, threading.Event(), threading.Event()
    reader = threading.Thread(target=read_stream, args=(port_a, path, key, arrived, ready, stop))
    reader.start()
    ready.wait()
    time.sleep(0.5)
    load_stop, counted = threading.Event(), [0, 0]
    loaders = [threading.Thread(target=load, args=(port_b, load_stop, counted, worker))
               for worker in range(2 if load_batch > 0 else 0)]
    for loader in loaders:
        loader.start()
    began = time.perf_counter()
    committed = {}
    for n in range(writes):
        time.sleep(pace_ms / 1000 * random.uniform(0.5, 1.5))
        ident = write(port_b, n)
        committed[ident] = time.perf_counter()
    load_stop.set()
    for loader in loaders:
        loader.join()
    if loaders:
        print(f"{name}: load {sum(counted) / (time.perf_counter() - began):,.0f} span starts/s "
              f"to the other server meanwhile")
    deadline = time.time() + 5
    while len(arrived) < len(committed) and time.time() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join()
    delays = [(arrived[i] - committed[i]) * 1000 for i in committed if i in arrived]
    missing = len(committed) - len(delays)
    print(f"{name}: {len(delays)} of {len(committed)} writes by the other process arrived; "
          f"commit to stream p50 {percentile(delays, 0.5):.1f} ms, "
          f"p99 {percentile(delays, 0.99):.1f} ms, max {max(delays, default=float('nan')):.1f} ms"
          + (f"; {missing} MISSING" if missing else ""))


def start_span(port, n):
    span = post(port, "/v1/activity/spans", {
        "spanId": f"x{n}", "runId": f"xrun{n}", "name": "tool", "kind": "tool",
        "origin": "session"})
    return span["spanId"]


def append(port, n):
    event = post(port, "/v1/engagements/xeng/events", {
        "type": "note", "at": n, "data": {"n": n}})
    return event["seq"]


with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR_FOR_DB", ".")) as directory:
    db = os.path.join(directory, "shared.db")
    a, port_a = start(db)
    b, port_b = start(db)
    try:
        measure("change stream", port_a, port_b, "/v1/activity/changes/stream",
                lambda change: (change.get("span") or {}).get("spanId"), start_span)
        measure("engagement stream", port_a, port_b, "/v1/engagements/xeng/stream",
                lambda event: event.get("seq"), append)
    finally:
        a.terminate()
        b.terminate()
        a.wait()
        b.wait()
