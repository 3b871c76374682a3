"""What many clients snapshotting one very large run cost the server in memory.

`fill` writes one run of SPANS spans, each with ~ATTR_KB KiB of word-salad attrs (compressible
like real tool output, not like random bytes), through the batch endpoint. `load` then has
CLIENTS clients each fetch the run's snapshot ROUNDS times, half of them reading the body at
once and half of them slowly (a client that stops reading holds its snapshot in the server),
while it samples the server's anonymous memory (`RssAnon` of /proc/PID/status) every 50 ms.

    flightlog serve --db big.db --addr 127.0.0.1:19811 --grpc-addr off &
    python3 bench/big_snapshot.py fill 19811 [SPANS=20000] [ATTR_KB=20]
    python3 bench/big_snapshot.py load 19811 PID [CLIENTS=8] [ROUNDS=2] [snapshot|stream]

With `stream` the clients open the run's live stream (`/v1/activity/runs/big/stream`) instead,
whose first event is the same snapshot, and each closes it once that event has arrived.

It prints the answers' statuses and sizes, the peak anonymous memory and the time taken.
"""
import collections, json, random, socket, sys, threading, time, urllib.error, urllib.request

mode, port = sys.argv[1], int(sys.argv[2])
base = f"http://127.0.0.1:{port}"

if mode == "fill":
    spans = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    attr_kb = int(sys.argv[4]) if len(sys.argv) > 4 else 20
    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]

    def salad(n):
        out, size = [], 0
        while size < n:
            w = rng.choice(words)
            out.append(w)
            size += len(w) + 1
        return " ".join(out)

    per_request = max(1, (6 << 20) // (attr_kb * 1024 + 400))
    ops = [{"op": "startSpan", "spanId": "big-root", "runId": "big", "name": "turn",
            "kind": "turn", "origin": "session", "startedAt": 1}]
    done = 0
    t0 = time.time()
    for i in range(spans):
        ops.append({"op": "startSpan", "spanId": f"big-{i}", "runId": "big",
                    "parentSpanId": "big-root", "name": "tool", "kind": "tool",
                    "origin": "session", "startedAt": 2 + i,
                    "attrs": {"output": salad(attr_kb * 1024), "n": i}})
        if len(ops) >= per_request or i == spans - 1:
            req = urllib.request.Request(base + "/v1/activity/batch",
                                         data=json.dumps({"ops": ops}).encode(),
                                         headers={"content-type": "application/json"})
            results = json.loads(urllib.request.urlopen(req).read())["results"]
            failed = [r for r in results if isinstance(r, dict) and "error" in r]
            if failed:
                raise SystemExit(f"{len(failed)} ops failed, e.g. {failed[0]}")
            done += len(ops)
            ops = []
    print(f"wrote {done} spans in {time.time() - t0:.1f} s")
    sys.exit(0)

pid = int(sys.argv[3])
clients = int(sys.argv[4]) if len(sys.argv) > 4 else 8
rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 2
what = sys.argv[6] if len(sys.argv) > 6 else "snapshot"
if what not in ("snapshot", "stream"):
    raise SystemExit(f"the sixth argument is snapshot or stream, not {what!r}")
path = f"/v1/activity/runs/big/{what}"
peak = [0]
running = [True]


def rss_anon_kib():
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def sample():
    while running[0]:
        peak[0] = max(peak[0], rss_anon_kib())
        time.sleep(0.05)


statuses = collections.Counter()
sizes = []
lock = threading.Lock()


def fetch(slow):
    for _ in range(rounds):
        if not slow and what == "snapshot":
            try:
                body = urllib.request.urlopen(base + path).read()
                with lock:
                    statuses[200] += 1
                    sizes.append(len(body))
            except urllib.error.HTTPError as err:
                with lock:
                    statuses[err.code] += 1
            continue
        # A slow reader: sends the request, reads the first bytes, then waits 5 s before
        # reading the rest, so the server holds what it has not written yet. (A stream client
        # reads until the first event's blank line: compact JSON has no line break.)
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n".encode()
                     + b"Connection: close\r\n\r\n")
        head = sock.recv(65536)
        status = int(head.split(b" ", 2)[1]) if head else 0
        if slow:
            time.sleep(5)
        total, tail = len(head), head[-1:]
        event_ended = what == "stream" and b"\n\n" in head
        while not event_ended:
            chunk = sock.recv(1 << 20)
            if not chunk:
                break
            total += len(chunk)
            event_ended = what == "stream" and b"\n\n" in tail + chunk
            tail = chunk[-1:]
        sock.close()
        with lock:
            statuses[status] += 1
            sizes.append(total)


baseline = rss_anon_kib()
sampler = threading.Thread(target=sample)
sampler.start()
t0 = time.time()
threads = [threading.Thread(target=fetch, args=(i % 2 == 1,)) for i in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
running[0] = False
sampler.join()
print(f"{clients} clients x {rounds}: statuses {dict(statuses)}, "
      f"largest answer {max(sizes or [0]) / 2**20:.0f} MiB, "
      f"RssAnon {baseline / 1024:.0f} MiB before, peak {peak[0] / 1024:.0f} MiB, "
      f"{time.time() - t0:.1f} s")
