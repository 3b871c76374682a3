"""The cost of many engagement-stream clients (BENCHMARKS.md, stop 54): K clients follow
engagement streams, spread over E engagements, while 4 writers append at a paced RATE a second
(each append 200 bytes of text) to those engagements in turn; the appends reached, the server's
CPU an append, and the events the clients received (every client gets each event of its
engagement once; they only count them).

Usage: python3 bench/streams/many_engagement_streams.py K RATE SECONDS [E=1]
(e.g. `100 1000 5` for 100 clients of one engagement, `1000 1000 5 1000` for one client on
each of 1,000 engagements; the clients' sockets need `ulimit -n` above K). FLBIN names the
server binary. Serves on 127.0.0.1:18543."""
import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sse_client import *
PORT = 18543
K, RATE, SECS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
E = int(sys.argv[4]) if len(sys.argv) > 4 else 1
WRITERS = 4
db = fresh_db("many-engagement-streams.db")
p = start_server(PORT, db, "--max-connections", str(max(2048, 2 * K)))
def cpu(): return cpu_seconds(p.pid)
def append(client, engagement, at):
    status, _ = client.append(engagement, "note", at, {"from": "a", "text": "x" * 200})
    assert status == 201, status
try:
    setup = Client(PORT)
    for e in range(E): append(setup, f"e{e}", 0)
    crowd = Crowd(PORT, [f"/v1/engagements/e{i % E}/stream" for i in range(K)], "journal")
    time.sleep(1.0)
    c0 = cpu()
    done, elapsed = paced_writes(PORT, WRITERS, RATE, SECS,
                                 lambda client, w, n: append(client, f"e{(w + n) % E}", n))
    c1 = cpu()
    time.sleep(1.0); crowd.close()
    print(f"K={K} E={E} rate={RATE}: appends {done / elapsed:.0f}/s, server CPU {c1 - c0:.2f} s "
          f"in {elapsed:.1f} s ({(c1 - c0) / max(1, done) * 1e6:.0f} us an append), "
          f"events received {crowd.received}" + (f" of {K // E * (done + E)}" if K % E == 0 else ""))
finally:
    p.terminate(); p.wait()
