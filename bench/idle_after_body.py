"""What idle keep-alive connections keep after a large request: N connections each send one
journal append with a ~60 KB body, read the answer, then stay open and idle; print the
server's RSS.

    python3 bench/idle_after_body.py HTTP_PORT SERVER_PID N"""
import socket, sys, time, json
port, pid, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"): return int(line.split()[1]) / 1024
print(f"rss before {rss():.1f} MiB", flush=True)
socks = []
for i in range(n):
    body = json.dumps({"type": "note", "at": i, "data": {"pad": "x" * 60000}}).encode()
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"POST /v1/engagements/idle-%d/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (i, len(body)) + body)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    socks.append(s)
time.sleep(2)
print(f"{n} idle connections after a 60 KB body each: rss {rss():.1f} MiB", flush=True)
for s in socks: s.close()
