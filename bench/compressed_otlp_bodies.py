"""Server memory while several clients post large gzipped OTLP/JSON exports at once: CLIENTS
connections each post one export of spans with 20 attributes (24 random bytes and some text
each) that inflates to about 50 MB and is about 7.6 MB gzipped. Samples the server's RSS every
0.05 s and prints the statuses and the peak. A compressed body holds what it will inflate to
of the request budget, so with the default 64 MiB one is handled at a time and the others get
503 (before: all 8 at once, 899 - 943 MiB).

    flightlog serve --db gz.db --addr 127.0.0.1:19738 --grpc-addr off & echo $! > server.pid
    python3 bench/compressed_otlp_bodies.py 19738 "$(cat server.pid)" 8
"""
import asyncio, gzip, json, sys, os, random
port=int(sys.argv[1]); pid=int(sys.argv[2]); clients=int(sys.argv[3])
peak=0
def rss():
    for l in open(f'/proc/{pid}/status'):
        if l.startswith('VmRSS'): return int(l.split()[1])//1024
def body(c):
    spans=[]
    n=0
    total=0
    while total < 52_000_000:
        attrs=[{"key":f"attr.{k}","value":{"stringValue":os.urandom(24).hex()+" lorem ipsum dolor sit amet "*4}} for k in range(20)]
        s={"traceId":f"{c+1:08x}{n//100:024x}","spanId":f"{c+1:04x}{n:012x}","name":"chat","startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000100000000","attributes":attrs}
        total += 4600
        spans.append(s); n+=1
    raw=json.dumps({"resourceSpans":[{"scopeSpans":[{"spans":spans}]}]}).encode()
    return gzip.compress(raw, 6), len(raw)
async def client(c, data):
    r,w=await asyncio.open_connection('127.0.0.1',port)
    w.write(b'POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\nConnection: close\r\n\r\n' % len(data))
    w.write(data); await w.drain()
    line=await r.readline(); rest=await r.read()
    w.close(); return line.decode().split(' ')[1] + ('' if line.startswith(b'HTTP/1.1 200') else ' '+rest[-200:].decode(errors='replace'))
async def sample():
    global peak
    while True:
        peak=max(peak,rss()); await asyncio.sleep(0.05)
async def main():
    bodies=[body(c) for c in range(clients)]
    print("gzip bytes", len(bodies[0][0]), "raw", bodies[0][1])
    s=asyncio.create_task(sample())
    res=await asyncio.gather(*[client(c,b[0]) for c,b in enumerate(bodies)], return_exceptions=True)
    s.cancel()
    from collections import Counter
    print(Counter(str(x)[:120] for x in res), "peak RSS", peak)
asyncio.run(main())
