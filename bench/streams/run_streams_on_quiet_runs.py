"""The cost of run streams on quiet runs while other runs are written (BENCHMARKS.md, stop 33):
server CPU and write throughput with 0, then K, then 0 run-stream clients on runs nobody writes,
and the time from a probe run's POST to its event on its own run stream.

Usage: python3 bench/streams/run_streams_on_quiet_runs.py K ATTR_BYTES SPANS_PER_S
(e.g. 200 4000 2000). Serves on 127.0.0.1:18523."""
import os, sys, statistics; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sse_client import *
PORT = 18523
K = int(sys.argv[1]) if len(sys.argv) > 1 else 100
ATTR = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
DUR = 4
db = f"{BASE}/p19.db"
for s in ("", "-wal", "-shm"):
    try: os.remove(db + s)
    except FileNotFoundError: pass
p = start_server(PORT, db)
def cpu():
    with open(f"/proc/{p.pid}/stat") as f: v = f.read().split(")")[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf("SC_CLK_TCK")
try:
    c = Client(PORT)
    for i in range(K): c.start(f"quiet{i}", f"quiet{i}")
    c.start("followed", "followed")
    import random
    POOL = ['%x' % random.getrandbits(ATTR * 4) for _ in range(500)]
    RATE = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    def phase(nclients):
        clients = [SSE(PORT, f"/v1/activity/runs/quiet{i}/stream") for i in range(nclients)]
        fol = SSE(PORT, "/v1/activity/runs/followed/stream"); fol.read_until(lambda s: len(s.events) >= 1, 5)
        stop = threading.Event(); cnt = [0]
        def writer(w):
            cw = Client(PORT); n = 0; nxt = time.time()
            while not stop.is_set():
                ops = [{"op": "startSpan", "spanId": f"L{nclients}-{w}-{n}-{i}", "runId": f"load{w}-{n}", "name": "t", "kind": "tool", "origin": "session", "attrs": {"pad": POOL[(n * 50 + i) % len(POOL)]}} for i in range(50)]
                cw.req("POST", "/v1/activity/batch", {"ops": ops}); n += 1; cnt[0] += 50
                nxt += 50 / (RATE / 2); time.sleep(max(0, nxt - time.time()))
        sent = {}; lat = []
        def prober():
            cp = Client(PORT); i = 0
            while not stop.is_set():
                sent[i] = time.time(); cp.event("followed", payload={"i": i}); i += 1; time.sleep(0.05)
        def drain():
            while not stop.is_set():
                for s in clients: s.poll(0.001)
        ws = [threading.Thread(target=writer, args=(w,)) for w in range(2)] + [threading.Thread(target=prober)]
        c0 = cpu(); t0 = time.time()
        for t in ws: t.start()
        arrived = {}
        while time.time() - t0 < DUR:
            for e in fol.poll(0.1):
                j = e.get("json") or {}
                if j.get("kind") == "event": arrived[j["event"]["payload"]["i"]] = time.time()
        stop.set()
        for t in ws: t.join()
        el = time.time() - t0; used = cpu() - c0
        fol.read_until(lambda s: False, 1)
        for e in fol.events:
            j = e.get("json") or {}
            if j.get("kind") == "event": arrived.setdefault(j["event"]["payload"]["i"], e["t"])
        d = sorted((arrived[i] - sent[i]) * 1000 for i in sent if i in arrived)
        print(f"{nclients:4} idle run streams: {cnt[0]/el:7.0f} spans/s written, server CPU {used/el*100:5.0f}% of one core, followed-run latency p50 {statistics.median(d):.1f} ms p99 {d[int(len(d)*.99)-1]:.1f} ms max {d[-1]:.1f} (n={len(d)}, missing {len(sent)-len(d)})")
        for s in clients: s.close()
        fol.close(); time.sleep(0.5)
    phase(0); phase(K); phase(0)
finally:
    p.terminate(); p.wait()
