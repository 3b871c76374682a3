"""What HTTP/2 connections can make the server hold before any request completes: N h2c
connections to the gRPC listener, each opening up to S export streams (as many as the server's
SETTINGS allow) with ~HDR_KIB KiB of metadata and a message declaring 8 MiB, sending DATA until
flow control stops it (no WINDOW_UPDATE is read); hold HOLD_S seconds; print the server's RSS.

    python3 bench/h2_hold.py GRPC_PORT SERVER_PID N S HDR_KIB HOLD_S

Needs the `h2` package (pip install h2)."""
import socket, sys, time
import h2.connection, h2.config, h2.exceptions
port, pid, n, streams, hdr_kib, hold = map(float, sys.argv[1:7]); port, n, streams = int(port), int(n), int(streams)
def rss():
    for line in open(f"/proc/{int(pid)}/status"):
        if line.startswith("VmRSS"): return int(line.split()[1]) / 1024
print(f"rss before {rss():.1f} MiB", flush=True)
conns = []
chunk = b"\x00" + (8 * 1024 * 1024).to_bytes(4, "big") + b"x" * 16379
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port)); s.setblocking(True)
    c = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
    c.initiate_connection(); s.sendall(c.data_to_send())
    s.settimeout(0.2)
    try:
        data = s.recv(65536); c.receive_data(data)
    except socket.timeout:
        pass
    for k in range(streams):
        sid = c.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                   (":path", "/opentelemetry.proto.collector.trace.v1.TraceService/Export"),
                   ("content-type", "application/grpc"), ("te", "trailers")]
        headers += [(f"x-pad-{j}", "a" * 1000) for j in range(int(hdr_kib))]
        try:
            c.send_headers(sid, headers)
        except h2.exceptions.TooManyStreamsError:
            break  # the server's SETTINGS_MAX_CONCURRENT_STREAMS
        sent = 0
        while True:
            w = min(c.local_flow_control_window(sid), c.max_outbound_frame_size, 16384)
            if w <= 0: break
            c.send_data(sid, chunk[:w] if sent == 0 else b"x" * w); sent += w
            if sent > 4 * 1024 * 1024: break
    s.sendall(c.data_to_send())
    conns.append((s, c))
    if (i + 1) % 100 == 0: print(f"{i+1} connections, rss {rss():.1f} MiB", flush=True)
time.sleep(1)
peak = 0; t0 = time.time()
while time.time() - t0 < hold:
    peak = max(peak, rss()); time.sleep(0.5)
print(f"holding {n} x {streams} streams: peak rss {peak:.1f} MiB", flush=True)
for s, _ in conns: s.close()
time.sleep(2); print(f"after close {rss():.1f} MiB", flush=True)
