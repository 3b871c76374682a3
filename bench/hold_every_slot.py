"""Clients that try to hold every connection slot without a token, and what an authorized
client then waits for a request: against `flightlog serve --token T --max-connections LIMIT`.

    python3 bench/hold_every_slot.py HTTP_PORT TOKEN KIND HOLDERS TRIES

KIND is how each of HOLDERS connections holds its slot:
  idle      a token-less request answered 401, then the connection is kept open, idle, and a
            token-less request re-sent every 20 s (the audit's case of stop 47);
  silent    connected, never sends a byte;
  trickle   sends one byte of a request head every second, never finishing it.
Every holder re-opens its connection as soon as the server closes it.
Then an authorized client makes TRIES requests (`GET /v1/activity/cursor`), each on a new
connection, one a second; each one's time to its answer is printed, then min / median / max.
Ends by itself: the holders are closed when the tries are done."""
import socket
import statistics
import sys
import threading
import time

port, token, kind, holders, tries = (
    int(sys.argv[1]),
    sys.argv[2],
    sys.argv[3],
    int(sys.argv[4]),
    int(sys.argv[5]),
)
stop = threading.Event()
closed_by_server = [0]
lock = threading.Lock()


def connect():
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def read_answer(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(head.split()[1])


def holder():
    """Holds one connection as KIND says until `stop`; counts the times the server closed it."""
    sock = None
    last = 0.0
    sent = 0
    while not stop.is_set():
        if sock is None:
            try:
                sock = connect()
                sock.settimeout(0.2)
            except OSError:
                time.sleep(0.1)
                continue
            last = 0.0
            sent = 0
        try:
            now = time.monotonic()
            if kind == "idle" and now - last >= 20:
                sock.sendall(b"GET /v1/activity/cursor HTTP/1.1\r\nHost: x\r\n\r\n")
                sock.settimeout(10)
                read_answer(sock)
                sock.settimeout(0.2)
                last = now
            elif kind == "trickle" and now - last >= 1:
                sock.sendall(b"GET /v1/activity/cursor HTTP/1.1\r\nX-Pad: "[sent : sent + 1] or b"a")
                sent += 1
                last = now
            try:
                if sock.recv(4096) == b"":
                    raise ConnectionResetError
            except socket.timeout:
                pass
        except OSError:
            with lock:
                closed_by_server[0] += 1
            sock.close()
            sock = None
    if sock is not None:
        sock.close()


threads = [threading.Thread(target=holder, daemon=True) for _ in range(holders)]
for thread in threads:
    thread.start()
time.sleep(3)
waits = []
for attempt in range(tries):
    started = time.monotonic()
    try:
        sock = connect()
        sock.sendall(
            b"GET /v1/activity/cursor HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + token.encode()
            + b"\r\nConnection: close\r\n\r\n"
        )
        status = read_answer(sock)
        sock.close()
    except OSError as error:
        status = f"error {error}"
    took = time.monotonic() - started
    waits.append(took)
    print(f"try {attempt + 1}: {status} after {took * 1000:.1f} ms", flush=True)
    time.sleep(1)
stop.set()
for thread in threads:
    thread.join(timeout=2)
print(
    f"{kind} x {holders}: authorized client waited min {min(waits) * 1000:.1f} ms, "
    f"median {statistics.median(waits) * 1000:.1f} ms, max {max(waits) * 1000:.1f} ms; "
    f"holders' connections closed by the server: {closed_by_server[0]}",
    flush=True,
)
