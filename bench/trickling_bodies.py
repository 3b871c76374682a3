"""Writes while many clients trickle their write bodies: N raw connections each send the head of
a `POST /v1/engagements/trickle-N/events` that declares 100 bytes, then one byte of the body
every 5 s (under the server's 10 s allowed between bytes), for HOLD seconds. Meanwhile one
well-behaved client sends a journal append every 50 ms on connections of its own and records
each status and latency; at the end the trickling clients send the rest of their bodies and read
their statuses. Prints the well-behaved writes' statuses and latencies (p50, p99, max), the
tricklers' statuses, and the server's peak RSS.

Until stop 45 a write took its slot of the write limit (4,096) before its body was read, so
4,096 such clients held every slot and every other write got 503 for as long as they trickled
(up to the 60 s a body may take). Now a write takes its slot once its body is here.

    ulimit -n 20000
    flightlog serve --db trickle.db --addr 127.0.0.1:19737 --grpc-addr off & echo $! > server.pid
    python3 bench/trickling_bodies.py 19737 "$(cat server.pid)" 4200 30
"""
import asyncio, sys, time
from collections import Counter

port, pid, clients, hold = (int(arg) for arg in sys.argv[1:5])
peak = 0


def rss_mib():
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


def append_body(n):
    body = b'{"type":"note","at":%d,"data":{}}' % n
    return body + b" " * (100 - len(body))


async def trickler(n, started):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = append_body(n)
    writer.write(
        b"POST /v1/engagements/trickle-%d/events HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n" % n
    )
    sent = 0
    while time.monotonic() - started < hold and sent < len(body) - 1:
        writer.write(body[sent : sent + 1])
        sent += 1
        await writer.drain()
        await asyncio.sleep(5)
    writer.write(body[sent:])
    await writer.drain()
    status = (await reader.readline()).decode().split(" ", 2)[1]
    writer.close()
    return status


async def well_behaved(started):
    results = []
    n = 0
    while time.monotonic() - started < hold:
        body = b'{"type":"note","at":%d,"data":{}}' % n
        n += 1
        begun = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/engagements/well-behaved/events HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % len(body)
                + body
            )
            await writer.drain()
            status = (await reader.readline()).decode().split(" ", 2)[1]
            writer.close()
        except Exception as error:  # a refused or reset connection is a result too
            status = type(error).__name__
        results.append((status, time.monotonic() - begun))
        await asyncio.sleep(0.05)
    return results


async def sample():
    global peak
    while True:
        peak = max(peak, rss_mib())
        await asyncio.sleep(0.1)


async def main():
    sampler = asyncio.create_task(sample())
    started = time.monotonic()
    tricklers = [asyncio.create_task(trickler(n, started)) for n in range(clients)]
    await asyncio.sleep(3)  # every trickler has sent its head and first byte
    writes = await well_behaved(time.monotonic() - 3)
    statuses = await asyncio.gather(*tricklers, return_exceptions=True)
    sampler.cancel()
    latencies = sorted(latency for _, latency in writes)
    def ms(q):
        return f"{latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000:.1f} ms"
    print(
        f"{clients} trickling bodies for {hold} s: well-behaved writes "
        f"{dict(Counter(status for status, _ in writes))}, p50 {ms(0.5)}, p99 {ms(0.99)}, "
        f"max {latencies[-1] * 1000:.1f} ms; tricklers {dict(Counter(map(str, statuses)))}; "
        f"peak RSS {peak} MiB"
    )


asyncio.run(main())
