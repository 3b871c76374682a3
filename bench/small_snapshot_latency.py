"""Latency of a small run's snapshot over HTTP against a span read (the same HTTP path, a point
read): what a snapshot costs beyond the request itself.

Makes run `small` (a root, 5 tools with 2 events each) if the server lacks it, then times N
keep-alive GETs of the span and N of the snapshot, twice in turn, and prints the p50s in µs.

    flightlog serve --db snap.db --addr 127.0.0.1:19733 --grpc-addr off &
    python3 bench/small_snapshot_latency.py 19733 3000
"""
import http.client, json, sys, time
port=int(sys.argv[1]); n=int(sys.argv[2])
c=http.client.HTTPConnection("127.0.0.1", port)
def req(m, p, b=None):
    c.request(m, p, body=json.dumps(b) if b is not None else None, headers={"content-type":"application/json"})
    r=c.getresponse(); d=r.read(); return r.status, d
st,_=req("GET","/v1/activity/runs/small/snapshot")
if st==404:
    req("POST","/v1/activity/spans",{"spanId":"small-root","runId":"small","name":"turn","kind":"turn","origin":"session"})
    for i in range(5):
        req("POST","/v1/activity/spans",{"spanId":f"small-{i}","runId":"small","parentSpanId":"small-root","name":"tool","kind":"tool","origin":"session","attrs":{"k":"v"*100}})
        for j in range(2):
            req("POST",f"/v1/activity/spans/small-{i}/events",{"eventType":"call","payload":{"text":"x"*200}})
lat={}
for path in ["/v1/activity/spans/small-2","/v1/activity/runs/small/snapshot"]*2:
    v=[]
    for _ in range(n):
        a=time.perf_counter(); st,_=req("GET",path); v.append((time.perf_counter()-a)*1e6)
        assert st==200
    v.sort(); lat.setdefault(path,[]).append(v[len(v)//2])
for p,v in lat.items(): print(p, "p50 us", ["%.0f"%x for x in v])
