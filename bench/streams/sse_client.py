"""A stdlib-only flightlog client for the stream benchmarks in this folder: start a server on a
fresh database, write through the HTTP API, read Server-Sent Events from a raw socket.

FLBIN names the flightlog binary (default: this workspace's target/release/flightlog);
FLBENCH_DIR the scratch folder (default: a new one under the system's temporary folder)."""
import http.client, json, os, socket, subprocess, sys, time, threading, signal

import tempfile

BIN = os.environ.get(
    "FLBIN",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "target", "release", "flightlog"),
)
BASE = os.environ.get("FLBENCH_DIR") or tempfile.mkdtemp(prefix="flightlog-stream-bench-")

def start_server(port, db, *extra, env=None, log=None, wait=True):
    log = log or f"{BASE}/server-{port}.log"
    args = [BIN, "serve", "--db", db, "--addr", f"127.0.0.1:{port}", "--grpc-addr", "off", *extra]
    e = dict(os.environ); e.update(env or {})
    f = open(log, "ab")
    p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=e, cwd=BASE)
    if wait:
        for _ in range(200):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/healthz"); r = c.getresponse(); r.read(); c.close()
                if r.status == 200: break
            except Exception:
                time.sleep(0.05)
        else:
            raise RuntimeError("server did not start; see " + log)
    return p

def fresh_db(name):
    """A database path in the scratch folder, its file and side files removed."""
    db = f"{BASE}/{name}"
    for suffix in ("", "-wal", "-shm"):
        try: os.remove(db + suffix)
        except FileNotFoundError: pass
    return db

def paced_writes(port, writers, rate, secs, write):
    """`writers` threads, each with its own client, call `write(client, writer, n)` for its n-th
    write, paced to `rate` writes a second in all, for `secs` seconds: (writes done, seconds
    taken)."""
    done = [0]
    def writer(w):
        client = Client(port); n = 0; t0 = time.time()
        while time.time() - t0 < secs:
            write(client, w, n); n += 1; done[0] += 1
            pause = t0 + n * writers / rate - time.time()
            if pause > 0: time.sleep(pause)
    t0 = time.time()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads: t.start()
    for t in threads: t.join()
    return done[0], time.time() - t0

def streams_beside_span_writes(port, label, streams, follow, kind, writers, rate, secs):
    """Start a server on a fresh database; `follow(setup_client, i)` readies the i-th stream's
    subject and returns its path; `streams` clients follow those streams (`kind` events) while
    `writers` start spans of other runs, paced to `rate` writes a second in all, for `secs`
    seconds. Prints the writes reached and the server's CPU in that time."""
    db = fresh_db(f"{label.replace(' ', '-')}-{streams}.db")
    p = start_server(port, db, "--max-connections", str(max(1024, 2 * streams + 64)))
    try:
        setup = Client(port)
        crowd = Crowd(port, [follow(setup, i) for i in range(streams)], kind)
        time.sleep(1.0)
        def start_a_span(client, w, n):
            status, _ = client.start(f"busy-{w}-{n}", f"busy-{w}-{n // 10}")
            assert status == 201, status
        c0 = cpu_seconds(p.pid)
        done, elapsed = paced_writes(port, writers, rate, secs, start_a_span)
        used = cpu_seconds(p.pid) - c0
        crowd.close()
        print(f"{streams:5} {label}: {done / elapsed:6.0f} writes/s, server CPU {used:.2f} s "
              f"in {elapsed:.1f} s")
    finally:
        p.terminate(); p.wait()

def cpu_seconds(pid):
    """User and system CPU time the process has used, in seconds."""
    with open(f"/proc/{pid}/stat") as f: fields = f.read().split(")")[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

class Crowd:
    """Many stream clients read by one thread that only counts `event: <kind>` lines: the
    clients cost the benchmark little, so what is measured is the server."""
    def __init__(self, port, paths, kind):
        import selectors
        self.selector = selectors.DefaultSelector(); self.kind = f"event: {kind}".encode()
        self.received = 0; self.stop = threading.Event()
        for path in paths:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            s.setblocking(False); self.selector.register(s, selectors.EVENT_READ)
        threading.Thread(target=self._read, daemon=True).start()
    def _read(self):
        while not self.stop.is_set():
            for key, _ in self.selector.select(0.2):
                try: data = key.fileobj.recv(1 << 20)
                except BlockingIOError: continue
                self.received += data.count(self.kind)
    def close(self):
        self.stop.set()

class Client:
    def __init__(self, port, token=None):
        self.port = port; self.token = token
        self.conn = None
    def req(self, method, path, body=None, headers=None):
        h = {"Content-Type": "application/json"}
        if self.token: h["Authorization"] = "Bearer " + self.token
        h.update(headers or {})
        data = None if body is None else (body if isinstance(body, (bytes, str)) else json.dumps(body))
        for attempt in range(3):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                self.conn.request(method, path, body=data, headers=h)
                r = self.conn.getresponse(); raw = r.read()
                try: js = json.loads(raw) if raw else None
                except Exception: js = raw
                return r.status, js
            except (http.client.HTTPException, ConnectionError, OSError):
                try: self.conn.close()
                except Exception: pass
                self.conn = None
                if attempt == 2: raise
    def start(self, span, run, parent=None, **kw):
        b = {"spanId": span, "runId": run, "name": kw.pop("name", "s"), "kind": kw.pop("kind", "tool" if parent else "turn"), "origin": "session"}
        if parent: b["parentSpanId"] = parent
        b.update(kw)
        return self.req("POST", "/v1/activity/spans", b)
    def end(self, span, outcome="success", **kw):
        b = {"outcome": outcome}; b.update(kw)
        return self.req("POST", f"/v1/activity/spans/{q(span)}/end", b)
    def event(self, span, et="e", payload=None):
        return self.req("POST", f"/v1/activity/spans/{q(span)}/events", {"eventType": et, "payload": payload if payload is not None else {}})
    def patch(self, span, **kw):
        return self.req("PATCH", f"/v1/activity/spans/{q(span)}", kw)
    def append(self, eng, type_="note", at=1, data=None, **kw):
        b = {"type": type_, "at": at, "data": data if data is not None else {}}; b.update(kw)
        return self.req("POST", f"/v1/engagements/{q(eng)}/events", b)

def q(s):
    import urllib.parse
    return urllib.parse.quote(s, safe="")

class SSE:
    """Raw-socket SSE client. Collects events (dicts with event,id,data,t)."""
    def __init__(self, port, path, headers=None, token=None, rcvbuf=None, timeout=30):
        self.port = port; self.path = path
        self.sock = socket.socket()
        if rcvbuf: self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        h = {"Host": f"127.0.0.1:{port}", "Accept": "text/event-stream"}
        if token: h["Authorization"] = "Bearer " + token
        h.update(headers or {})
        req = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
        self.sock.sendall(req.encode())
        self.buf = b""; self.status = None; self.headers = {}; self.chunked = False
        self.body = b""  # dechunked but unparsed
        self.events = []; self.comments = []; self.closed = False
        self._cur = {}
        self._read_head()
    def _recv(self):
        d = self.sock.recv(65536)
        if not d: self.closed = True
        return d
    def _read_head(self):
        while b"\r\n\r\n" not in self.buf:
            d = self._recv()
            if not d: raise RuntimeError("closed before head")
            self.buf += d
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1])
        for l in lines[1:]:
            k, v = l.split(":", 1); self.headers[k.strip().lower()] = v.strip()
        self.chunked = self.headers.get("transfer-encoding", "") == "chunked"
        if self.status != 200:
            # read body
            if "content-length" in self.headers:
                n = int(self.headers["content-length"])
                while len(self.buf) < n:
                    d = self._recv()
                    if not d: break
                    self.buf += d
                self.error_body = self.buf[:n]
            else:
                self.error_body = self.buf
    def _dechunk(self):
        if not self.chunked:
            self.body += self.buf; self.buf = b""; return
        while True:
            i = self.buf.find(b"\r\n")
            if i < 0: return
            n = int(self.buf[:i].split(b";")[0], 16)
            if n == 0:
                self.ended_cleanly = True
                self.buf = b""; return
            if len(self.buf) < i + 2 + n + 2: return
            self.body += self.buf[i+2:i+2+n]
            self.buf = self.buf[i+2+n+2:]
    def _parse(self):
        out = []
        while True:
            i = self.body.find(b"\n")
            if i < 0: break
            line = self.body[:i].decode(); self.body = self.body[i+1:]
            if line == "":
                if self._cur:
                    self._cur["t"] = time.time()
                    if "data" in self._cur:
                        try: self._cur["json"] = json.loads(self._cur["data"])
                        except Exception: pass
                    self.events.append(self._cur); out.append(self._cur)
                self._cur = {}
            elif line.startswith(":"):
                self.comments.append((time.time(), line))
            else:
                k, _, v = line.partition(":")
                if v.startswith(" "): v = v[1:]
                if k == "data" and "data" in self._cur: self._cur["data"] += "\n" + v
                else: self._cur[k] = v
        return out
    def poll(self, timeout=None):
        """Read once (blocking up to timeout). Returns new events."""
        if self.buf:
            self._dechunk(); out = self._parse()
            if out: return out
        if self.closed: return []
        if timeout is not None: self.sock.settimeout(timeout)
        try:
            d = self._recv()
        except socket.timeout:
            return []
        except (ConnectionResetError, OSError):
            self.closed = True; return []
        self.buf += d
        self._dechunk()
        return self._parse()
    def read_until(self, pred, timeout=10):
        dl = time.time() + timeout
        while time.time() < dl and not self.closed:
            self.poll(max(0.01, dl - time.time()))
            if pred(self): return True
        return pred(self)
    def close(self):
        try: self.sock.close()
        except Exception: pass

def rss_fds(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS"): rss = int(l.split()[1])
    return rss, len(os.listdir(f"/proc/{pid}/fd"))
