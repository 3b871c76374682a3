"""Server memory per journal-stream client of a large engagement (BENCHMARKS.md, stop 33): one
engagement of 10,000 events of ~1.7 KB of data each, then K stream clients from seq 0 that
read slowly; the server's RSS before and at the peak.

Usage: python3 bench/streams/journal_stream_memory.py K (e.g. 16). Serves on 127.0.0.1:18542."""
import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sse_client import *
PORT = 18542
K = int(sys.argv[1]) if len(sys.argv) > 1 else 4
db = f"{BASE}/p35.db"
for s in ("", "-wal", "-shm"):
    try: os.remove(db + s)
    except FileNotFoundError: pass
p = start_server(PORT, db)
try:
    c = Client(PORT)
    data = {f"k{j}": j for j in range(150)}
    body_len = len(json.dumps(data))
    def w(off):
        cc = Client(PORT)
        for i in range(off, 10000, 4): cc.append("full", "note", at=1 + i, data=data)
    # appends must be in order for `at`? no: seq is server-assigned; run 1 writer to keep it simple
    t = time.time()
    for i in range(10000): c.append("full", "note", at=1 + i, data=data)
    print(f"10,000 events of {body_len} B of JSON data each ({10000*body_len/1e6:.0f} MB) in {time.time()-t:.0f}s; next append ->", c.append("full", "note", at=20000)[0])
    print("GET /events size:", len(json.dumps(c.req("GET", "/v1/engagements/full/events")[1]))/1e6, "MB")
    base = rss_fds(p.pid)[0]
    peak = [base]; stop = threading.Event()
    def mon():
        while not stop.is_set(): peak[0] = max(peak[0], rss_fds(p.pid)[0]); time.sleep(0.02)
    m = threading.Thread(target=mon); m.start()
    cl = [SSE(PORT, "/v1/engagements/full/stream", rcvbuf=4096, timeout=30) for _ in range(K)]
    time.sleep(3); stop.set(); m.join()
    print(f"{K} slow journal-stream clients: server rss {base//1024} MiB -> peak {peak[0]//1024} MiB (+{(peak[0]-base)/1024/K:.0f} MiB per client)")
    for s in cl: s.close()
finally:
    p.terminate(); p.wait()
