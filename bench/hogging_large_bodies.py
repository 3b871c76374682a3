"""Large writes while a few clients hog the budget of large bodies: N raw connections each send
the head of a `POST /v1/activity/batch` that declares 8,388,608 bytes and then, by MODE,
- `heads`: nothing more (the server cuts it off after the 10 s a body may go without a byte);
- `slow`: the body's first 64 KiB at once, then a byte every 3 s;
each reopened as soon as it is answered, for HOLD seconds. Meanwhile one well-behaved client
sends, every 200 ms, a 200 KB batch (over 64 KiB: the budget of large bodies) and a small
journal append (the budget of small bodies), each on a connection of its own, and records
their statuses and latencies. Prints both clients' statuses, the batches' latency (p50, p99,
max) and the hogs' answers.

Until stop 46 a large body took its declared length before its first byte arrived: 8 heads
declaring 8 MiB held all of the 64 MiB budget, and 43 of 44 batches got 503. Now a head holds
nothing, and a body holding the budget while another waits for it must arrive at 128 KiB/s.

    ulimit -n 4096
    flightlog serve --db hog.db --addr 127.0.0.1:19738 --grpc-addr off &
    python3 bench/hogging_large_bodies.py 19738 heads 8 30
    python3 bench/hogging_large_bodies.py 19738 slow 8 30
"""
import asyncio, sys, time
from collections import Counter

port, mode, hogs, hold = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
DECLARED = 8 * 1024 * 1024
assert mode in ("heads", "slow"), "MODE is heads or slow"


async def status_of(reader):
    line = await reader.readline()
    parts = line.decode(errors="replace").split(" ", 2)
    return parts[1] if len(parts) > 1 else "closed"


async def hog(n, until, answers):
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/activity/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n" % DECLARED
            )
            if mode == "slow":
                writer.write(b'{"ops":[' + b" " * (64 * 1024))
            await writer.drain()
            answer = asyncio.create_task(status_of(reader))
            while not answer.done() and time.monotonic() < until:
                if mode == "slow":
                    writer.write(b" ")
                    await writer.drain()
                await asyncio.wait([answer], timeout=3)
            status = await answer if answer.done() else "unanswered at the end"
            writer.close()
        except Exception as error:  # a reset connection is an answer too
            status = type(error).__name__
        answers[status] += 1


async def post(path, body):
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (path, len(body))
            + body
        )
        await writer.drain()
        status = await status_of(reader)
        writer.close()
        return status
    except Exception as error:
        return type(error).__name__


async def timed(request):
    begun = time.monotonic()
    status = await request
    return status, time.monotonic() - begun


async def well_behaved(until):
    batches, appends, latencies = Counter(), Counter(), []
    n = 0
    while time.monotonic() < until:
        n += 1
        batch = (
            b'{"ops":[{"op":"startSpan","spanId":"w%d","runId":"well-behaved","name":"x",'
            b'"kind":"tool","origin":"session","attrs":{"blob":"' % n
            + b"x" * 200_000
            + b'"}}]}'
        )
        append = b'{"type":"note","at":%d,"data":{}}' % n
        (batch_status, latency), append_status = await asyncio.gather(
            timed(post(b"/v1/activity/batch", batch)),
            post(b"/v1/engagements/well-behaved/events", append),
        )
        latencies.append(latency)
        batches[batch_status] += 1
        appends[append_status] += 1
        await asyncio.sleep(0.2)
    return batches, appends, sorted(latencies)


async def main():
    until = time.monotonic() + hold
    answers = Counter()
    hogging = [asyncio.create_task(hog(n, until, answers)) for n in range(hogs)]
    await asyncio.sleep(1 if hogs else 0)  # the hogs have sent their heads
    batches, appends, latencies = await well_behaved(until)
    await asyncio.gather(*hogging)

    def ms(q):
        return f"{latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000:.0f}"

    print(
        f"{hogs} hogs ({mode}) for {hold} s: batches of 200 KB {dict(batches)} "
        f"(p50 / p99 / max {ms(0.5)} / {ms(0.99)} / {latencies[-1] * 1000:.0f} ms), "
        f"appends {dict(appends)}; hogs answered {dict(answers)}"
    )


asyncio.run(main())
