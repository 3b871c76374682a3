"""Run streams on quiet runs beside paced single-op writes (BENCHMARKS.md, stops 53 and 54):
K run-stream clients follow runs nobody writes while 2 writers start spans of other runs, one
request and one commit each, at a paced RATE a second in all for SECONDS; the server's CPU in
that time, against the same with no stream, and the writes reached. Each commit rang every run
stream; what a quiet run's stream costs is the difference.

Usage: python3 bench/streams/quiet_run_streams_single_writes.py K RATE SECONDS
(e.g. `200 1000 8`). FLBIN names the server binary. Serves on 127.0.0.1:18544."""
import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sse_client import *
PORT = 18544
K, RATE, SECS = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
WRITERS = 2

def measure(streams):
    db = fresh_db(f"quiet-run-streams-{streams}.db")
    p = start_server(PORT, db, "--max-connections", str(max(1024, 2 * streams)))
    def cpu(): return cpu_seconds(p.pid)
    try:
        setup = Client(PORT)
        for i in range(streams):
            status, _ = setup.start(f"quiet-{i}", f"quiet-{i}")
            assert status == 201, status
        crowd = Crowd(PORT, [f"/v1/activity/runs/quiet-{i}/stream" for i in range(streams)], "change")
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
        print(f"{streams:5} quiet run streams: {done[0] / elapsed:6.0f} writes/s, server CPU "
              f"{used:.2f} s in {elapsed:.1f} s")
    finally:
        p.terminate(); p.wait()

measure(0); measure(K); measure(0)
