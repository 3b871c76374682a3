"""What unfinished request heads can make the server hold: open N connections that each send
about HEAD_KIB KiB (headers of ~3 KB each, so up to 3 KB more) of a request head without its
end, and hold them HOLD_S seconds; print the server's RSS before, while and after.

    python3 bench/big_heads.py HTTP_PORT SERVER_PID N HEAD_KIB HOLD_S

Raise `ulimit -n` for N past ~1,000."""
import socket, sys, time
port, pid, n, head_kib, hold = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
def rss():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
print(f"rss before {rss():.1f} MiB", flush=True)
socks = []
line = b"X-Pad-%06d: " + b"a" * 3000 + b"\r\n"
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.setblocking(True)
    head = b"POST /v1/activity/spans HTTP/1.1\r\nHost: x\r\n"
    k = 0
    while len(head) < head_kib * 1024:
        head += line % k
        k += 1
    s.sendall(head)
    socks.append(s)
    if (i + 1) % 500 == 0:
        print(f"{i+1} connections, rss {rss():.1f} MiB", flush=True)
time.sleep(1)
print(f"holding {n} x {head_kib} KiB: rss {rss():.1f} MiB", flush=True)
t0 = time.time()
peak = 0
while time.time() - t0 < hold:
    peak = max(peak, rss()); time.sleep(0.5)
print(f"peak while holding {peak:.1f} MiB", flush=True)
for s in socks: s.close()
time.sleep(2)
print(f"after close rss {rss():.1f} MiB", flush=True)
