"""A long mixed run against one `flightlog serve`: does anything grow that should not?

The benchmarks run each workload for seconds on a fresh database. This runs them together for
minutes on one server with its scheduled maintenance on short settings, the way a long-lived
install sees them, and samples the server every SAMPLE seconds:

- activity writers (single-op, each as its own `Flightlog-Writer`): runs of a root `turn` and
  three `tool` spans with a ~300-byte event each, ended, rolled up; one run in 50 is left open
  with no heartbeat, for the stale sweep (`--stale-after-ms 20000`) to close as `interrupted`;
- a batch writer: five such runs a `POST /v1/activity/batch`;
- journal appenders: engagements opened, given ~150 mail, board, budget and tool events,
  closed as completed and compacted, 40 alive at once; the age retention
  (`--journal-max-age-ms 60000`) removes them a minute after their last event;
- one live client on `/v1/activity/changes/stream` for the whole run, which must see every
  change id once and in order with no gap (or an explicit resync event, counted);
- one live client on an engagement's stream (appended to at ~100/s), whose seqs must be 0, 1,
  2, ... with no gap;
- every 15 s a short-lived stream client that connects, reads a few events and hangs up
  (streams opened and dropped must not leak);
- activity retention: ended runs older than 30 s are pruned (`--prune-after-ms 30000`), every
  second (`--maintenance-every-ms 1000`).

Each sample line: elapsed time, writes so far, the server's RSS (all of it, and the anonymous
part: the mapped database file is the rest), open file descriptors, the database and WAL file
sizes, and what the maintenance did so far (runs pruned, spans swept, engagements removed). At
the end it checks, and exits 1 on any miss:
- anonymous RSS, RSS and descriptors levelled off after the first two minutes' warm-up (the
  last third's highest value at most 10% above the middle third's; runs under 4 minutes skip
  this check);
- both live clients saw a gap-free sequence, and every request had its expected status;
- the runs left open were swept;
- once the writers have stopped, no write slot and none of the budgets of request bodies is
  still held (`/metrics`);
- the detail tables hold no more than the retention allows (see `bounds` below); the digest of
  each run (rollup row and run key) is kept by design, and its bytes a run are printed.

    python3 bench/soak.py [SECONDS=600] [SAMPLE=10]

FLBIN names the server binary (default target/release/flightlog). Binds 127.0.0.1 only; stops
by itself after SECONDS.
"""
import json
import multiprocessing
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "streams"))
import sse_client as fl  # noqa: E402

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 600
SAMPLE = float(sys.argv[2]) if len(sys.argv) > 2 else 10
PAYLOAD = {"tool": "search", "query": "flight recorder " * 8, "results": ["x" * 40] * 4}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """A keep-alive HTTP/1.1 client that writes each request, head and body, with one
    `sendall`, as hyper, Go's net/http and Node do for small bodies. `http.client` (and so
    `requests`) writes the head and the body apart; a thread of this script starved of the GIL
    between the two (by the garbage collection of millions of kept stream events, seconds at a
    time) looked to the server like a body that stalled, and got its 408 after 10 s."""

    def __init__(self, port):
        self.port = port
        self.sock = None
        self.buffer = b""

    def req(self, method, path, body=None, headers=None):
        data = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}",
                 f"Content-Length: {len(data)}"]
        if body is not None:
            lines.append("Content-Type: application/json")
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + data
        for attempt in range(2):
            reused = self.sock is not None
            if self.sock is None:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.buffer = b""
            try:
                self.sock.sendall(request)
                while b"\r\n\r\n" not in self.buffer:
                    self._receive()
                break
            except ConnectionError:
                # The server closes a keep-alive connection idle for 30 s (its head timeout);
                # a request sent on it as it closes gets no answer and was not handled. Sent
                # again once on a new connection, as HTTP clients do; anything else is raised.
                no_answer = not self.buffer
                self.sock.close()
                self.sock = None
                if not (reused and no_answer and attempt == 0):
                    raise
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        head_lines = head.decode("latin-1").split("\r\n")
        status = int(head_lines[0].split()[1])
        fields = {}
        for line in head_lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip().lower()
        if fields.get("transfer-encoding") == "chunked":
            raw = self._read_chunked()
        else:
            length = int(fields.get("content-length", "0"))
            while len(self.buffer) < length:
                self._receive()
            raw, self.buffer = self.buffer[:length], self.buffer[length:]
        if fields.get("connection") == "close":
            self.sock.close()
            self.sock = None
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw

    def _receive(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self.buffer += chunk

    def _read_chunked(self):
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                self._receive()
            size_line, self.buffer = self.buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(self.buffer) < size + 2:
                self._receive()
            body += self.buffer[:size]
            self.buffer = self.buffer[size + 2:]
            if size == 0:
                return body


port = free_port()
db = os.path.join(fl.BASE, "soak.db")
server = fl.start_server(
    port, db,
    "--maintenance-every-ms", "1000",
    "--prune-after-ms", "30000",
    "--stale-after-ms", "20000",
    "--stuck-after-ms", "off",
    "--journal-max-events", "1000000",
    "--journal-max-age-ms", "60000",
)
deadline = time.time() + SECONDS
# The writers are threads of this process; the stream clients, which parse thousands of events
# a second, run in processes of their own so that they do not starve the writers of the GIL.
stop = multiprocessing.Event()
reports = multiprocessing.Queue()
counts = {"writes": 0, "batch_ops": 0, "spans": 0, "appends": 0, "left_open": 0,
          "engagements_done": 0}
counts_lock = threading.Lock()


def count(key, n=1):
    with counts_lock:
        counts[key] += n


def fail(message):
    reports.put(("failure", f"{time.strftime('%H:%M:%S')} {message}"))
    stop.set()


def guarded(work):
    """`work` as a thread's or process's target whose exception (a refused connection, a reset,
    an answer that cannot be parsed) fails the soak instead of ending the thread unnoticed."""
    def run(*args):
        try:
            work(*args)
        except Exception as error:  # noqa: BLE001 (any error of a client is the soak's failure)
            fail(f"{work.__name__}: {type(error).__name__}: {error}")
    return run


def expect(status, wanted, what):
    if status != wanted:
        fail(f"{what}: HTTP {status}, wanted {wanted}")
        return False
    return True


def activity_writer(index):
    client = Client(port)
    writer_header = {"Flightlog-Writer": f"soak-writer-{index}"}
    n = 0
    while not stop.is_set():
        run = f"w{index}-r{n}"
        root = f"{run}-root"
        status, _ = client.req("POST", "/v1/activity/spans", {
            "spanId": root, "runId": run, "name": "turn", "kind": "turn", "origin": "session",
        }, writer_header)
        if not expect(status, 201, "start root"):
            return
        writes = 1
        for t in range(3):
            span = f"{run}-t{t}"
            status, _ = client.req("POST", "/v1/activity/spans", {
                "spanId": span, "runId": run, "parentSpanId": root, "name": "search",
                "kind": "tool", "origin": "session"}, writer_header)
            if not expect(status, 201, "start tool"):
                return
            status, _ = client.req("POST", f"/v1/activity/spans/{span}/events",
                                   {"eventType": "tool_output", "payload": PAYLOAD},
                                   writer_header)
            if not expect(status, 201, "event"):
                return
            status, _ = client.req("POST", f"/v1/activity/spans/{span}/end",
                                   {"outcome": "success"}, writer_header)
            if not expect(status, 200, "end tool"):
                return
            writes += 3
        if n % 50 == 49:
            count("left_open")
        else:
            status, _ = client.req("POST", f"/v1/activity/spans/{root}/end", {
                "outcome": "success",
                "usage": {"inputTokens": 1200, "outputTokens": 300, "costUsd": 0.004}},
                writer_header)
            if not expect(status, 200, "end root"):
                return
            status, _ = client.req("POST", f"/v1/activity/runs/{run}/rollup", None, writer_header)
            if not expect(status, 204, "rollup"):
                return
            writes += 2
        count("writes", writes)
        count("spans", 4)
        n += 1


def batch_writer():
    client = Client(port)
    n = 0
    while not stop.is_set():
        ops = []
        runs = []
        for _ in range(5):
            run = f"b-r{n}"
            runs.append(run)
            root = f"{run}-root"
            ops.append({"op": "startSpan", "spanId": root, "runId": run, "name": "turn",
                        "kind": "turn", "origin": "session"})
            for t in range(3):
                span = f"{run}-t{t}"
                ops.append({"op": "startSpan", "spanId": span, "runId": run,
                            "parentSpanId": root, "name": "search", "kind": "tool",
                            "origin": "session"})
                ops.append({"op": "appendEvent", "spanId": span, "eventType": "tool_output",
                            "payload": PAYLOAD})
                ops.append({"op": "endSpan", "spanId": span, "outcome": "success"})
            ops.append({"op": "endSpan", "spanId": root, "outcome": "success"})
            n += 1
        status, body = client.req("POST", "/v1/activity/batch", {"ops": ops})
        if not expect(status, 200, "batch"):
            return
        refused = [r for r in body["results"] if isinstance(r, dict) and "error" in r]
        if refused:
            fail(f"batch op refused: {refused[:2]}")
            return
        for run in runs:
            status, _ = client.req("POST", f"/v1/activity/runs/{run}/rollup")
            if not expect(status, 204, "batch rollup"):
                return
        count("batch_ops", len(ops))
        count("spans", 20)


def journal_appender(index):
    """Engagements with a life: opened, ~150 mail, board, budget and tool events, closed as
    completed, compacted (admin), then left for the age retention to remove; 20 alive at once."""
    client = Client(port)
    rng = random.Random(index)
    alive = {}  # engagement id -> events appended
    born = 0
    while not stop.is_set():
        while len(alive) < 20:
            engagement = f"eng-{index}-{born}"
            born += 1
            status, _ = client.req("POST", f"/v1/engagements/{engagement}/events", {
                "type": "engagement_opened", "at": int(time.time() * 1000),
                "data": {"initiator": "human:alice", "venue": "slack:#agents"}})
            if not expect(status, 201, "open engagement"):
                return
            alive[engagement] = 1
        engagement = rng.choice(list(alive))
        n = alive[engagement]
        now = int(time.time() * 1000)
        if n >= 150:
            status, _ = client.req("POST", f"/v1/engagements/{engagement}/events", {
                "type": "engagement_closed", "at": now, "data": {"status": "completed"}})
            if not expect(status, 201, "close engagement"):
                return
            status, _ = client.req("POST", f"/v1/engagements/{engagement}/compact")
            if not expect(status, 204, "compact"):
                return
            del alive[engagement]
            count("engagements_done")
            continue
        choice = n % 4
        if choice == 0:
            event = ("mail_sent", {"mailId": f"m{n}", "kind": "ask",
                                   "from": "agent:lead", "to": f"agent:w{n % 5}"})
        elif choice == 1:
            event = ("board_written", {"key": f"note-{n % 30}", "content": "x" * 120,
                                       "actor": "agent:lead"})
        elif choice == 2:
            event = ("budget_charged", {"amount": 0.002, "actor": f"agent:w{n % 5}"})
        else:
            event = ("tool_called", {"tool": "search", "actor": f"agent:w{n % 5}"})
        status, _ = client.req("POST", f"/v1/engagements/{engagement}/events",
                               {"type": event[0], "at": now, "data": event[1]})
        if not expect(status, 201, "append"):
            return
        alive[engagement] = n + 1
        count("appends")


def watched_engagement_appender():
    """Appends to one engagement at ~100/s; its stream must see seqs 1, 2, 3, ..."""
    client = Client(port)
    while not stop.is_set():
        status, _ = client.req("POST", "/v1/engagements/watched/events", {
            "type": "custom_note", "at": int(time.time() * 1000), "data": {"text": "tick"}})
        if not expect(status, 201, "watched append"):
            return
        count("appends")
        time.sleep(0.01)


def changes_follower(after):
    """Process: one client on the global change stream for the whole run."""
    live = {"changes": 0, "change_gaps": 0, "resyncs": 0, "last_change": None}
    try:
        stream = fl.SSE(port, f"/v1/activity/changes/stream?after={after}", timeout=5)
        if stream.status != 200:
            fail(f"changes stream: HTTP {stream.status}")
            return
        expected = after + 1
        while not stop.is_set():
            for event in stream.poll(1):
                kind = event.get("event", "message")
                if kind == "change":
                    change_id = int(event["id"])
                    if change_id != expected:
                        live["change_gaps"] += 1
                    expected = change_id + 1
                    live["changes"] += 1
                    live["last_change"] = change_id
                elif kind == "resync":
                    live["resyncs"] += 1
            stream.events.clear()  # kept, they would grow this process by gigabytes an hour
            if stream.closed:
                fail("the changes stream closed during the run")
                return
        stream.close()
    finally:
        reports.put(("live", live))


def journal_follower_and_churner():
    """Process: one client on the watched engagement's stream for the whole run, and a thread
    that every 15 s opens a change stream and a journal stream, reads a little and hangs up."""
    live = {"journal": 0, "journal_gaps": 0, "churned": 0}

    def churn():
        client = Client(port)
        while not stop.wait(15):
            _, cursor = client.req("GET", "/v1/activity/cursor")
            after = max(0, cursor["changeCursor"] - 100)
            stream = fl.SSE(port, f"/v1/activity/changes/stream?after={after}", timeout=5)
            stream.read_until(lambda s: len(s.events) >= 50, timeout=5)
            stream.close()
            journal = fl.SSE(port, f"/v1/engagements/watched/stream?fromSeq={live['journal']}",
                             timeout=5)
            journal.read_until(lambda s: len(s.events) >= 10, timeout=5)
            journal.close()
            live["churned"] += 1

    churner = threading.Thread(target=guarded(churn))
    churner.start()
    try:
        stream = fl.SSE(port, "/v1/engagements/watched/stream", timeout=5)
        if stream.status != 200:
            fail(f"journal stream: HTTP {stream.status}")
            return
        expected = 0
        while not stop.is_set():
            for event in stream.poll(1):
                if event.get("event") == "journal":
                    seq = event["json"]["seq"]
                    if seq != expected:
                        live["journal_gaps"] += 1
                    expected = seq + 1
                    live["journal"] += 1
            stream.events.clear()
            if stream.closed:
                fail("the journal stream closed during the run")
                return
        stream.close()
    finally:
        churner.join()
        reports.put(("live", live))


def file_size(path):
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def metric(client, name):
    status, text = client.req("GET", "/metrics")
    if status != 200:
        return float("nan")
    if isinstance(text, bytes):
        text = text.decode()
    for line in str(text).splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


reader = Client(port)
_, cursor = reader.req("GET", "/v1/activity/cursor")
followers = [
    multiprocessing.Process(target=guarded(changes_follower), args=(cursor["changeCursor"],)),
    multiprocessing.Process(target=guarded(journal_follower_and_churner)),
]
for process in followers:
    process.start()
time.sleep(1)  # the followers' streams are open before the first write
threads = [threading.Thread(target=guarded(activity_writer), args=(i,)) for i in range(3)]
threads += [threading.Thread(target=guarded(batch_writer))]
threads += [threading.Thread(target=guarded(journal_appender), args=(i,)) for i in range(2)]
threads += [threading.Thread(target=guarded(watched_engagement_appender))]
for thread in threads:
    thread.start()


def memory(pid):
    """VmRSS, RssAnon (the heap: what a leak grows) and RssFile (mostly the database file the
    readers map with mmap_size, which grows with the file and is the kernel's page cache), KiB."""
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                fields[key] = int(value.split()[0])
    return fields


def table_rows(path):
    """Rows of the tables the retention must bound, and the digest rows kept by design."""
    import sqlite3
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {table: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("activity_spans", "activity_events", "activity_changes",
                              "journal_events", "activity_run_rollups", "activity_runs")}
    finally:
        conn.close()


samples = []
started = time.time()
print("   s     writes  batch ops   appends  RSS MiB  anon MiB  fds   db MiB  wal MiB"
      "  pruned runs  swept  engagements removed")
while time.time() < deadline and not stop.is_set():
    stop.wait(min(SAMPLE, max(0, deadline - time.time())))
    if server.poll() is not None:
        fail(f"the server exited (status {server.returncode})")
        break
    try:
        kib = memory(server.pid)
        fds = len(os.listdir(f"/proc/{server.pid}/fd"))
        sample = {
            "s": round(time.time() - started),
            "writes": counts["writes"], "batch_ops": counts["batch_ops"],
            "appends": counts["appends"],
            "rss_mib": kib["VmRSS"] / 1024, "anon_mib": kib["RssAnon"] / 1024, "fds": fds,
            "db_mib": file_size(db) / 2**20, "wal_mib": file_size(db + "-wal") / 2**20,
            "pruned": metric(reader, "flightlog_maintenance_runs_pruned_total"),
            "swept": metric(reader, "flightlog_maintenance_stale_spans_closed_total"),
            "removed": metric(reader, "flightlog_maintenance_engagements_removed_total"),
        }
    except (OSError, KeyError) as error:  # the server went away between the check and here
        fail(f"sampling the server: {type(error).__name__}: {error}")
        break
    samples.append(sample)
    print(f"{sample['s']:>4} {sample['writes']:>10} {sample['batch_ops']:>10} "
          f"{sample['appends']:>9} {sample['rss_mib']:>8.1f} {sample['anon_mib']:>9.1f} "
          f"{fds:>4} {sample['db_mib']:>8.1f} {sample['wal_mib']:>8.1f} "
          f"{sample['pruned']:>12.0f} {sample['swept']:>6.0f} {sample['removed']:>20.0f}",
          flush=True)
stop.set()
for thread in threads:
    thread.join(timeout=30)
live, failures = {}, []
for _ in followers:
    kind, value = reports.get(timeout=60)
    while kind == "failure":
        failures.append(value)
        kind, value = reports.get(timeout=60)
    live.update(value)
for process in followers:
    process.join(timeout=30)
while not reports.empty():
    failures.append(reports.get()[1])
# With every writer stopped, nothing may still hold a write slot or any of the budgets of
# request bodies: a request that kept what it took would starve the server slowly.
held = {name: metric(reader, name) for name in (
    "flightlog_http_writes_in_flight",
    "flightlog_http_request_budget_held_bytes",
    "flightlog_http_small_body_budget_held_bytes",
)}
for name, value in held.items():
    if value != 0:
        failures.append(f"{name} is {value} with no request in flight")
server.terminate()
server.wait(timeout=30)
elapsed = time.time() - started

verdict = {"seconds": round(elapsed), **counts, **live, "failures": failures}
# The first two minutes are warm-up (caches, the payload dictionary, the WAL's first cycles).
steady = [sample for sample in samples if sample["s"] >= 120]
if len(steady) < 6:
    verdict["levelled"] = "not checked: run for at least 4 minutes"
else:
    third = len(steady) // 3
    for key in ("rss_mib", "anon_mib", "fds"):
        middle = max(sample[key] for sample in steady[third:2 * third])
        last = max(sample[key] for sample in steady[2 * third:])
        verdict[f"{key}_middle_third_max"] = round(middle, 1)
        verdict[f"{key}_last_third_max"] = round(last, 1)
        # Levelled off: the last third may exceed the middle third by at most 10% (noise, a
        # checkpoint landing in one and not the other), not keep climbing.
        if last > middle * 1.10 + (2 if key == "fds" else 0):
            failures.append(f"{key} still growing: {middle:.1f} in the middle third, "
                            f"{last:.1f} in the last")
if live["change_gaps"] or live["journal_gaps"]:
    failures.append(f"gaps: {live['change_gaps']} in changes, "
                    f"{live['journal_gaps']} in the journal")
# A run left open is swept 20 s after its last write, at the next pass: a minute is plenty.
if counts["left_open"] and samples and samples[-1]["s"] > 60 and not samples[-1]["swept"] > 0:
    failures.append("runs left open were never swept as stale")

# What the file holds at the end. Detail must be bounded by the retention: spans and events of
# runs ended in the last 30 s (plus the stale sweep's 20 s for the runs left open, plus the
# maintenance pass), the change log's newest 100,000 rows (the reference's trim), journal events
# of engagements active in the last 60 s and all of the watched one (never idle). The digest of
# every run (its rollup row and run key) is kept by design, like the reference's rollups.
rows = table_rows(db)
verdict["rows_at_end"] = rows
spans_per_second = counts["spans"] / elapsed
appends_per_second = counts["appends"] / elapsed
bounds = {
    "activity_spans": spans_per_second * 60,
    "activity_events": spans_per_second * 60,
    "activity_changes": 100_000 + (counts["writes"] + counts["batch_ops"]) / elapsed * 5,
    "journal_events": live["journal"] + appends_per_second * 75,
}
for table, bound in bounds.items():
    if rows[table] > bound:
        failures.append(f"{table}: {rows[table]} rows at the end, more than the retention's "
                        f"~{bound:.0f}")
# Once the detail is at its steady size, the file grows by the digests of the runs pruned.
pruned_since_half = samples[-1]["pruned"] - samples[len(samples) // 2]["pruned"] if samples else 0
verdict["digest_bytes_a_run"] = round(
    (samples[-1]["db_mib"] - samples[len(samples) // 2]["db_mib"]) * 2**20 / pruned_since_half
) if pruned_since_half > 0 else None
print(json.dumps(verdict))
sys.exit(1 if failures else 0)
