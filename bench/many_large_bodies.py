"""Server memory while many clients send large bodies at once: N raw connections each send a
`POST /v1/activity/batch` of SIZE bytes (one span start with a large attribute) all but its last
byte, hold it 4 s, then send the last byte and read the status. Samples the server's RSS every
0.1 s and prints the statuses and the peak. Without the request budget every body is held at
once (100 x 8 MB: 1,164 MiB); with it, what does not fit gets 503.

    flightlog serve --db bodies.db --addr 127.0.0.1:19736 --grpc-addr off & echo $! > server.pid
    python3 bench/many_large_bodies.py 19736 "$(cat server.pid)" 100 8000000
"""
import asyncio, sys
from collections import Counter

port, pid, clients, size = (int(arg) for arg in sys.argv[1:5])
peak = 0


def rss_mib():
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024
    return 0


async def client(n):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = (
        b'{"ops":[{"op":"startSpan","spanId":"s%d","runId":"r%d","name":"x","kind":"tool",'
        b'"origin":"session","attrs":{"blob":"' % (n, n)
        + b"x" * (size - 200)
        + b'"}}]}'
    )
    writer.write(
        b"POST /v1/activity/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body)
    )
    writer.write(body[:-1])
    await writer.drain()
    await asyncio.sleep(4)
    writer.write(body[-1:])
    await writer.drain()
    status = (await reader.readline()).decode().split(" ", 2)[1]
    writer.close()
    return status


async def sample():
    global peak
    while True:
        peak = max(peak, rss_mib())
        await asyncio.sleep(0.1)


async def main():
    sampler = asyncio.create_task(sample())
    statuses = await asyncio.gather(*(client(n) for n in range(clients)), return_exceptions=True)
    sampler.cancel()
    print(f"{clients} bodies of {size} bytes: statuses {dict(Counter(map(str, statuses)))}; "
          f"peak RSS {peak} MiB")


asyncio.run(main())
