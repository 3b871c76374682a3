"""Cost of the change log's trim: RUNS finished runs of 11 changes each (a root, 3 tools with an
event each) written through the batch endpoint, then 12 `prune` calls that prune no run (the
hard ceiling far away) and each trim up to 20,000 change rows behind the newest 100,000; each
call's time in ms.

    flightlog serve --db trim.db --addr 127.0.0.1:19737 --grpc-addr off &
    python3 bench/trim_calls.py 19737 25000
"""
import json, sys, time, urllib.request
base=f"http://127.0.0.1:{sys.argv[1]}"; runs=int(sys.argv[2])
def post(path, body):
    r=urllib.request.Request(base+path, data=json.dumps(body).encode(), headers={"content-type":"application/json"})
    return json.loads(urllib.request.urlopen(r).read() or b"null")
ops=[]
for r in range(runs):
    root=f"r{r}-root"
    ops.append({"op":"startSpan","spanId":root,"runId":f"run{r}","name":"turn","kind":"turn","origin":"session","startedAt":1000})
    for t in range(3):
        sid=f"r{r}-t{t}"
        ops.append({"op":"startSpan","spanId":sid,"runId":f"run{r}","parentSpanId":root,"name":"tool","kind":"tool","origin":"session","startedAt":1001})
        ops.append({"op":"appendEvent","spanId":sid,"eventType":"out","payload":{"ok":True,"n":r}})
        ops.append({"op":"endSpan","spanId":sid,"outcome":"success","endedAt":1002})
    ops.append({"op":"endSpan","spanId":root,"outcome":"success","endedAt":1003})
    if len(ops)>=900:
        post("/v1/activity/batch",{"ops":ops}); ops=[]
if ops: post("/v1/activity/batch",{"ops":ops})
print("cursor", json.loads(urllib.request.urlopen(base + "/v1/activity/cursor").read()))
times=[]
for i in range(12):
    b=time.perf_counter(); res=post("/v1/activity/maintenance/prune",{"digestFloorAt":0,"hardCeilingMs":10**13}); times.append((round((time.perf_counter()-b)*1000,1), res.get("runsPruned")))
print("prune calls ms:", times)
