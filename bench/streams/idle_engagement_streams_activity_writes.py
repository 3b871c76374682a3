"""Idle engagement streams beside paced activity writes (BENCHMARKS.md, stop 55): K clients
follow K engagements nobody appends to while 2 writers start spans, one request and one commit
each, at a paced RATE a second in all for SECONDS; the server's CPU in that time, against the
same with no stream, and the writes reached. Before stop 55 every commit rang the journal's
doorbell and the streams' hub read the head of every followed engagement at each ring (at most
25 a second); what an idle engagement stream costs is the difference.

Usage: python3 bench/streams/idle_engagement_streams_activity_writes.py K RATE SECONDS
(e.g. `3000 1000 8`; the clients' sockets need `ulimit -n` above K). FLBIN names the server
binary. Serves on 127.0.0.1:18545."""
import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sse_client import *
PORT = 18545
K, RATE, SECS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
WRITERS = 2

def measure(streams):
    db = fresh_db(f"idle-engagement-streams-{streams}.db")
    p = start_server(PORT, db, "--max-connections", str(max(1024, 2 * streams + 64)))
    def cpu(): return cpu_seconds(p.pid)
    try:
        setup = Client(PORT)
        for i in range(streams):
            status, _ = setup.append(f"idle-{i}", "note", 1, {"from": "a", "text": "hello"})
            assert status == 201, status
        crowd = Crowd(PORT, [f"/v1/engagements/idle-{i}/stream" for i in range(streams)], "journal")
        time.sleep(1.0)
        done = [0]
        def writer(w):
            client = Client(PORT); n = 0; t0 = time.time()
            while time.time() - t0 < SECS:
                status, _ = client.start(f"busy-{w}-{n}", f"busy-{w}-{n // 10}")
                assert status == 201, status
                n += 1; done[0] += 1
                pause = t0 + n * WRITERS / RATE - time.time()
                if pause > 0: time.sleep(pause)
        c0 = cpu(); t0 = time.time()
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(WRITERS)]
        for t in threads: t.start()
        for t in threads: t.join()
        elapsed = time.time() - t0; used = cpu() - c0
        crowd.close()
        print(f"{streams:5} idle engagement streams: {done[0] / elapsed:6.0f} writes/s, server "
              f"CPU {used:.2f} s in {elapsed:.1f} s")
    finally:
        p.terminate(); p.wait()

measure(0); measure(K); measure(0)
