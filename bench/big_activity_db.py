"""Fill a running flightlog with a large activity database, through the batch endpoint.

Per run: a root `turn`, 5 `tool` children with two ~200-byte events, a usage patch and an end
each, then the root's end (every 10th run's root stays open). 8 runs per request, 4 clients.

    flightlog serve --db big.db --addr 127.0.0.1:19711 --grpc-addr off &
    python3 bench/big_activity_db.py 19711 200000     # about 1 min; 5.4 million changes
"""
import json, urllib.request, sys, concurrent.futures as cf
port=int(sys.argv[1]); n=int(sys.argv[2])
payload={"text":"x"*200}
def run_ops(i):
    ops=[{"op":"startSpan","spanId":f"r{i}","runId":f"run{i}","name":"turn","kind":"turn","origin":"session","startedAt":1000+i}]
    for t in range(5):
        sid=f"r{i}t{t}"
        ops.append({"op":"startSpan","spanId":sid,"runId":f"run{i}","parentSpanId":f"r{i}","name":"tool","kind":"tool","origin":"session","startedAt":1000+i})
        ops.append({"op":"appendEvent","spanId":sid,"eventType":"call","payload":payload,"ts":1001+i})
        ops.append({"op":"appendEvent","spanId":sid,"eventType":"result","payload":payload,"ts":1002+i})
        ops.append({"op":"patchSpan","spanId":sid,"usage":{"inputTokens":10,"outputTokens":5}})
        ops.append({"op":"endSpan","spanId":sid,"outcome":"success","endedAt":1003+i})
    if i%10: ops.append({"op":"endSpan","spanId":f"r{i}","outcome":"success","endedAt":1004+i})
    return ops
def post(b):
    ops=[]
    for i in range(b, min(n,b+8)): ops+=run_ops(i)
    req=urllib.request.Request(f"http://127.0.0.1:{port}/v1/activity/batch", data=json.dumps({"ops":ops}).encode(), headers={"content-type":"application/json"})
    results=json.loads(urllib.request.urlopen(req).read())["results"]
    failed=[r for r in results if isinstance(r, dict) and "error" in r]
    if failed:
        raise SystemExit(f"batch at run {b}: {len(failed)} ops failed, e.g. {failed[0]}")
with cf.ThreadPoolExecutor(4) as ex: list(ex.map(post, range(0,n,8)))
